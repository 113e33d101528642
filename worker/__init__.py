"""memworker: the agent-memory lifecycle worker and its working-memory library."""

__version__ = "0.1.0"
