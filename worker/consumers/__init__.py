"""The one consumer-group loop every group runs on: read, settle, reclaim, dead-letter.

Owns each group's pending entries and the DLQ streams; knows nothing of what a handler does.
"""
