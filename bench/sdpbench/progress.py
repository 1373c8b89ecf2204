"""A live progress line: rewritten in place on a terminal, plain lines
otherwise (logs, CI)."""
from __future__ import annotations

import shutil
import sys
import time


class Progress:
    def __init__(self, total: int, stream=None, enabled: bool = True):
        self.total = max(total, 1)
        self.done = 0
        self.stream = stream or sys.stdout
        self.enabled = enabled
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.t0 = time.monotonic()
        self._last_len = 0

    def _eta(self) -> str:
        el = time.monotonic() - self.t0
        if self.done == 0:
            return f"{el:5.0f}s"
        rem = el / self.done * (self.total - self.done)
        return f"{el:5.0f}s eta {rem:4.0f}s"

    def update(self, msg: str, advance: int = 0) -> None:
        self.done += advance
        if not self.enabled:
            return
        pct = 100.0 * min(self.done, self.total) / self.total
        line = f"[{pct:5.1f}% {self._eta()}] {msg}"
        if self.tty:
            width = shutil.get_terminal_size((100, 20)).columns - 1
            line = line[:width]
            pad = max(self._last_len - len(line), 0)
            self.stream.write("\r" + line + " " * pad)
            self._last_len = len(line)
        elif advance:
            # not a terminal: one plain line per finished run
            self.stream.write(line + "\n")
        self.stream.flush()

    def message(self, msg: str) -> None:
        """A line that stays (warnings, phase changes)."""
        if not self.enabled:
            return
        if self.tty and self._last_len:
            self.stream.write("\r" + " " * self._last_len + "\r")
            self._last_len = 0
        self.stream.write(msg + "\n")
        self.stream.flush()

    def finish(self) -> None:
        if self.enabled and self.tty and self._last_len:
            self.stream.write("\n")
            self.stream.flush()
            self._last_len = 0
