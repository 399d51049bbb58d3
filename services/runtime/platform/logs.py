"""JSON logs on stderr, each line carrying the request id of the request it belongs to."""

import logging
import math
import sys
import time
from contextvars import ContextVar

from pythonjsonlogger.json import JsonFormatter

current_request_id: ContextVar[str] = ContextVar("request_id", default="")


class _RequestIdFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if not getattr(record, "request_id", None):
            record.request_id = current_request_id.get()
        return True


def configure(level: str = "INFO") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter("%(asctime)s %(levelname)s %(name)s %(message)s %(request_id)s", timestamp=False))
    handler.addFilter(_RequestIdFilter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    for noisy in ("aiokafka", "kafka"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


class Throttled:
    """A logger's warnings (or errors) at most once per `every_s`: a failure repeated on every call (Redis
    away, a flood) would otherwise flood the log; its metric counts every one."""

    def __init__(self, logger: logging.Logger, every_s: float = 10.0) -> None:
        self._logger = logger
        self._every_s = every_s
        self._last = -math.inf

    def warning(self, message: str, *, exc_info: bool = False) -> None:
        self._log(logging.WARNING, message, exc_info)

    def error(self, message: str) -> None:
        self._log(logging.ERROR, message, False)

    def _log(self, level: int, message: str, exc_info: bool) -> None:
        now = time.monotonic()
        if now - self._last >= self._every_s:
            self._last = now
            self._logger.log(level, message, exc_info=exc_info)
