"""``ppe.logging``: the ``ppe`` logger tree applications and ppe-core log through.

Like PPE, the root logger is named ``ppe`` and ``get_logger(name)`` returns its child
``ppe.<name>``. Unlike PPE, importing ppe-core installs no handler: the ``ppe`` logger is set
up the first time :func:`get_logger` (or :func:`_get_root_logger`) is called, from the
``PPE_LOG_LEVEL`` (default ``ERROR``) and ``PPE_LOG_FILENAME`` (default: standard error)
environment variables.
"""

from __future__ import annotations

import logging
import os
import threading
from logging import CRITICAL, DEBUG, ERROR, INFO, WARNING

from ppe_core._console import in_notebook, is_terminal

__all__ = [
    "CRITICAL",
    "DEBUG",
    "ERROR",
    "INFO",
    "WARNING",
    "get_logger",
    "in_notebook",
    "is_terminal",
]

#: Environment variable naming the log level (``DEBUG`` ... ``CRITICAL``).
LOG_LEVEL_ENV = "PPE_LOG_LEVEL"
#: Environment variable naming a file to log into instead of standard error.
LOG_FILENAME_ENV = "PPE_LOG_FILENAME"

_LOGGER_NAME = "ppe"
_LOGGER_FORMAT = "[%(name)s] %(asctime)s: (%(levelname)s) %(message)s"
_LEVELS = {logging.getLevelName(lvl): lvl for lvl in (DEBUG, INFO, WARNING, ERROR, CRITICAL)}

_lock = threading.Lock()
_logger: logging.Logger | None = None
_handler: logging.Handler | None = None


def _configure_logging(
    *,
    filename: str | None = None,
    level: str = "ERROR",
    format: str = _LOGGER_FORMAT,
) -> None:
    """(Re)configures the ``ppe`` logger: one handler, one level.

    The environment variables win over the arguments, as in PPE. Calling it again replaces
    the handler installed by the previous call instead of adding a second one.

    Args:
        filename: File to append log records to; standard error when None.
        level: Level name such as ``'DEBUG'``; an unknown name selects ``INFO`` with a warning.
        format: ``logging.Formatter`` format string.
    """
    global _logger, _handler
    filename = os.environ.get(LOG_FILENAME_ENV, filename)
    level = os.environ.get(LOG_LEVEL_ENV, level)
    handler: logging.Handler = (
        logging.StreamHandler() if filename is None else logging.FileHandler(filename)
    )
    handler.setFormatter(logging.Formatter(format))
    with _lock:
        logger = logging.getLogger(_LOGGER_NAME)
        if _handler is not None:
            logger.removeHandler(_handler)
            _handler.close()
        logger.addHandler(handler)
        _handler = handler
        _logger = logger
    known = _LEVELS.get(level)
    logger.setLevel(INFO if known is None else known)
    if known is None:
        logger.warning("invalid %s (%s); using INFO", LOG_LEVEL_ENV, level)


def _get_root_logger() -> logging.Logger:
    """Returns the ``ppe`` logger, configuring it on first use."""
    if _logger is None:
        _configure_logging()
    assert _logger is not None
    return _logger


def get_logger(name: str) -> logging.Logger:
    """Returns the logger ``ppe.<name>`` for application code.

    Args:
        name: The child's name, e.g. ``'app'`` for ``ppe.app``.

    Returns:
        A ``logging.Logger`` below the ``ppe`` logger; its records go to the ``ppe`` handler.
    """
    return _get_root_logger().getChild(name)
