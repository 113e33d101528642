"""Logging: structlog, JSON when not on a terminal, readable on one; every line (ours and the
libraries', tracebacks included) passes ``worker.credentials.mask``, so no password shows.

Bind ``project_id``, ``session_id`` and ``event_id`` with ``log.bind(...)`` where a line is
about one command, so an operator can grep one session's story out of many workers' logs.
"""

from __future__ import annotations

import logging
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # structlog (and the rich it may load) costs a command's start ~0.1 s
    import structlog

from worker.credentials import mask


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
    renderer: structlog.types.Processor
    if as_json:
        processors.append(structlog.processors.format_exc_info)
        renderer = structlog.processors.JSONRenderer()
    else:
        renderer = structlog.dev.ConsoleRenderer()
    processors.append(_masked(renderer))
    structlog.configure(
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )
    logging.basicConfig(level=max(numeric, logging.WARNING), stream=sys.stderr, force=True)
    for handler in logging.getLogger().handlers:
        handler.setFormatter(MaskingFormatter(handler.formatter))


def _masked(renderer: structlog.types.Processor) -> structlog.types.Processor:
    """``renderer`` whose output (the whole line, tracebacks too) shows no password."""

    def render(logger: Any, name: str, event: Any) -> Any:
        line = renderer(logger, name, event)
        return mask(line) if isinstance(line, str) else line

    return render


class MaskingFormatter(logging.Formatter):
    """A standard-library formatter whose lines (tracebacks too) show no password: the
    records of libraries (uvicorn, asyncio, redis) as well as ours."""

    def __init__(self, inner: logging.Formatter | None) -> None:
        super().__init__()
        self.inner = inner or logging.Formatter(logging.BASIC_FORMAT)

    def format(self, record: logging.LogRecord) -> str:
        return mask(self.inner.format(record))


def get_logger(name: str) -> structlog.stdlib.BoundLogger:
    import structlog

    logger: structlog.stdlib.BoundLogger = structlog.get_logger(name)
    return logger
