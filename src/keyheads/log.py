"""The package's log: one `keyheads` logger that every module writes through (never print).

Library code only logs; what is shown is decided once, by the `keyheads` command (`configure`):
progress notes (INFO) on stderr, and with --quiet only warnings and errors. A program that imports
keyheads and configures nothing sees warnings only (Python's default), so the library stays quiet.

    from keyheads.log import logger
    logger.info("resuming from %s at step %d", folder, step)
"""
from __future__ import annotations

import logging
import sys

logger = logging.getLogger("keyheads")
FORMAT = "[keyheads] %(message)s"
# bitsandbytes (imported by PEFT whenever it is installed) warns on every CPU import that an optional 4-bit
# matmul kernel is missing; keyheads never uses 4-bit layers, so that one logger shows errors only.
logging.getLogger("bitsandbytes.backends.cpu.ops").setLevel(logging.ERROR)


class _Stderr(logging.StreamHandler):
    """Writes to whatever sys.stderr is at the time (a test or a caller may have replaced it)."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:  # StreamHandler sets it; the property above always wins
        pass


_handler = _Stderr()
_handler.setFormatter(logging.Formatter(FORMAT))


def configure(quiet: bool = False) -> None:
    """Show the package's notes on stderr (INFO), or with `quiet` only warnings and errors.
    Calling it again changes the level; the handler is added once."""
    logger.setLevel(logging.WARNING if quiet else logging.INFO)
    if _handler not in logger.handlers:
        logger.addHandler(_handler)
