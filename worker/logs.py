"""Logging: structlog, JSON when not on a terminal, readable on one.

Bind ``project_id``, ``session_id`` and ``event_id`` with ``log.bind(...)`` where a line is
about one command, so an operator can grep one session's story out of many workers' logs.
"""

from __future__ import annotations

import logging
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # structlog (and the rich it may load) costs a command's start ~0.1 s
    import structlog


def configure_logging(level: str = "INFO", json: bool | None = None) -> None:
    """Configure structlog and the standard library's root logger once per process."""
    import structlog
    import structlog.dev

    as_json = (not sys.stderr.isatty()) if json is None else json
    numeric = logging.getLevelName(level.upper())
    if not isinstance(numeric, int):
        numeric = logging.INFO
    processors: list[structlog.types.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        structlog.processors.StackInfoRenderer(),
    ]
    if as_json:
        processors += [structlog.processors.format_exc_info, structlog.processors.JSONRenderer()]
    else:
        processors.append(structlog.dev.ConsoleRenderer())
    structlog.configure(
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )
    logging.basicConfig(level=max(numeric, logging.WARNING), stream=sys.stderr, force=True)


def get_logger(name: str) -> structlog.stdlib.BoundLogger:
    import structlog

    logger: structlog.stdlib.BoundLogger = structlog.get_logger(name)
    return logger
