"""The memory inspector: ``memworker serve``'s pages at ``/ui`` (what memory holds about a
user, recall with its scores, forget with a receipt, the live change feed, streams and DLQs).
Owns nothing: it reads through the library and forgets through ``worker.erasure``."""
