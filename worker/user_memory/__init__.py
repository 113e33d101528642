"""User memory: what an agent knows about a user across sessions (LoomFlow's ``Memory``).

Owns the ``memory_blocks``, ``facts`` and ``memory_changes`` rows, the turns in ``episodes``,
and the change feed ``P:changes:{i}``; ``Memory`` is the way in.
"""
