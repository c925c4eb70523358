"""Kiln's loggers and the ``debug`` setting.

Every module logs under the ``kiln`` logger hierarchy (``kiln.dynamo``, ``kiln.partition``,
``kiln.dryrun``, ...). Kiln never configures logging on import; ``debug=True`` lowers the
``kiln`` logger to DEBUG for the duration of one compilation and, when nothing else would
show the records, attaches a stderr handler for that time.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

ROOT = "kiln"


def get_logger(name: str) -> logging.Logger:
    return logging.getLogger(f"{ROOT}.{name}" if name else ROOT)


@contextlib.contextmanager
def debug_logging(enabled: bool) -> Iterator[None]:
    """DEBUG-level ``kiln`` logging inside the block when ``enabled``."""
    if not enabled:
        yield
        return
    logger = logging.getLogger(ROOT)
    old_level = logger.level
    handler: logging.Handler | None = None
    if not logger.hasHandlers():
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(name)s %(levelname)s: %(message)s"))
        logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        yield
    finally:
        logger.setLevel(old_level)
        if handler is not None:
            logger.removeHandler(handler)
