"""Erasure: forgetting and exporting a project, a session, a user's data or its history before
a time, everywhere memworker keeps it, and the record that keeps every replay from bringing it
back (docs/architecture.md lists its modules).

It owns the ``erasures`` rows, ``P:erased``, ``P:{i}:erased_users`` and forgotten sessions'
markers.
"""
