"""An OS-level wake descriptor for a zmq.Poller: eventfd where there is one, else a socketpair.

Other threads call wake(); the thread that polls registers `fd` and calls clear() when woken.
"""

from __future__ import annotations

import os


class Waker:
    """An OS-level wake descriptor: eventfd where there is one, else a socketpair."""

    def __init__(self) -> None:
        self._efd = -1
        self._closed = False
        if hasattr(os, "eventfd"):
            self._efd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
            self.fd = self._efd
        else:  # pragma: no cover - non-Linux
            import socket

            self._r, self._w = socket.socketpair()
            self._r.setblocking(False)
            self._w.setblocking(False)
            self.fd = self._r.fileno()

    def wake(self) -> None:
        if self._closed:
            return
        try:
            if self._efd >= 0:
                os.eventfd_write(self._efd, 1)
            else:  # pragma: no cover
                self._w.send(b"\0")
        except (BlockingIOError, OSError):
            pass  # already signalled or closing: a wake is pending either way

    def clear(self) -> None:
        if self._closed:
            return
        try:
            if self._efd >= 0:
                os.eventfd_read(self._efd)
            else:  # pragma: no cover
                while self._r.recv(4096):
                    pass
        except (BlockingIOError, OSError):
            pass

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._efd >= 0:
            os.close(self._efd)
            self._efd = -1
        else:  # pragma: no cover
            self._r.close()
            self._w.close()
