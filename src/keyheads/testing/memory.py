"""A process's peak anonymous memory, for the measures of how much of a model a process holds (Linux only).

The kernel keeps a peak of all resident memory (VmHWM), which counts the pages of the weights files a process
maps: page cache, shared by the processes and given back under pressure. What a process allocated is its
anonymous memory (RssAnon), of which the kernel keeps no peak, so a thread samples it every millisecond.
"""
from __future__ import annotations

import threading
import time
from pathlib import Path

STATUS = Path("/proc/self/status")


def status(key: str) -> int:
    """A /proc/self/status figure in bytes ("RssAnon", "VmHWM")."""
    for line in STATUS.read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(key)


class AnonymousPeak:
    """The peak of this process's anonymous resident memory since it was made."""

    def __init__(self) -> None:
        self.peak = status("RssAnon")
        threading.Thread(target=self._watch, daemon=True).start()

    def _watch(self) -> None:
        while True:
            self.peak = max(self.peak, status("RssAnon"))
            time.sleep(0.001)
