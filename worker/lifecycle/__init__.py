"""Lifecycle commands: intake, the atomic apply in Redis, admission, and the worker that runs them.

Owns the command streams, the result streams and each session's working-memory keys it writes.
"""
