"""What dpsynth tells its user as a run goes: records on the ``dpsynth`` logger, each with its event's name and
fields. The library prints nothing: a Python user sees them through :mod:`logging` (``logging.basicConfig(level=
logging.INFO)``) or reads them with a handler of their own; the command line prints them (:func:`printed_to`).
Progress bars (tqdm) go to standard error, as ever."""
from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any, TextIO

LOGGER = logging.getLogger("dpsynth")
LOGGER.addHandler(logging.NullHandler())  # silent unless the application configures logging


def tell(event: str, text: str, **fields: Any) -> None:
    """Tell the user ``text``, an ``event`` with ``fields`` (record attributes ``event`` and ``fields``)."""
    LOGGER.info(text, extra={"event": event, "fields": fields})


def warn(event: str, text: str, **fields: Any) -> None:
    """As :func:`tell`, at the warning level."""
    LOGGER.warning(text, extra={"event": event, "fields": fields})


@contextlib.contextmanager
def printed_to(stream: TextIO, warnings_to: TextIO | None = None) -> Iterator[None]:
    """Within the block, print every message's text to ``stream`` (warnings to ``warnings_to`` when given)."""
    handlers = [_handler(stream, lambda record: record.levelno < logging.WARNING or warnings_to is None)]
    if warnings_to is not None:
        handlers.append(_handler(warnings_to, lambda record: record.levelno >= logging.WARNING))
    level, propagate = LOGGER.level, LOGGER.propagate
    LOGGER.setLevel(logging.INFO)
    LOGGER.propagate = False  # printed once, whatever the root logger does
    for handler in handlers:
        LOGGER.addHandler(handler)
    try:
        yield
    finally:
        for handler in handlers:
            LOGGER.removeHandler(handler)
        LOGGER.setLevel(level)
        LOGGER.propagate = propagate


@contextlib.contextmanager
def silenced() -> Iterator[None]:
    """Within the block, tell nothing (a tool's own runs, whose outcome it reports itself)."""
    disabled, LOGGER.disabled = LOGGER.disabled, True
    try:
        yield
    finally:
        LOGGER.disabled = disabled


def _handler(stream: TextIO, accepts: Any) -> logging.Handler:
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(message)s"))
    handler.addFilter(accepts)
    return handler
