"""The doorbell that wakes the sleeping flusher thread: an eventfd, or a pipe where there is none."""

from __future__ import annotations

import os
import sys


class Doorbell:
    """Wakes the sleeping flusher thread. A blocked read on an eventfd (a pipe where there is
    none) releases the GIL and hands over in about half the time a `threading.Condition`
    round trip takes, which bounds how fast a group follows the one before it."""

    def __init__(self) -> None:
        if hasattr(os, "eventfd"):
            self._r = self._w = os.eventfd(0, os.EFD_CLOEXEC)
            self._msg = (1).to_bytes(8, sys.byteorder)
        else:
            self._r, self._w = os.pipe()
            self._msg = b"\x01"
        self._closed = False

    def ring(self) -> None:
        if not self._closed:
            os.write(self._w, self._msg)

    def wait(self) -> None:
        os.read(self._r, 4096)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        os.close(self._r)
        if self._w != self._r:
            os.close(self._w)
