"""The ``memworker`` command line: one module per command group.

Owns no data; each command calls the room that does the work.
"""

from worker.cli.app import main

__all__ = ["main"]
