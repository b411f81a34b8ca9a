"""The TCP connections a gloo process group opened in this process, so that a rank leaving a broken group can end
its side of them: a live peer blocked reading from this rank then fails at once instead of at the group's timeout.

A gloo collective fails by itself when a peer's process dies (the kernel closes its sockets). A peer that broke
out of the collective and stays alive (an in-process restart) keeps them open as long as its process group object
lives, and a model the script keeps across attempts (a DDP reducer) keeps it alive: torch's destroy, abort and
shutdown of a gloo group all leave them open (measured on torch 2.13: a peer blocked on such a rank waited until
that process exited). Shutting the write side sends the peer an end of file; the read side stays open, since
gloo's own thread ends the process (``gloo::EnforceNotMet``) when a socket it polls is shut both ways.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket

log = logging.getLogger(__name__)

_TCP = (socket.AF_INET, socket.AF_INET6)


def socket_inodes() -> dict[int, str]:
    """This process's open sockets: descriptor -> ``socket:[inode]`` (the kernel's name for the socket)."""
    out: dict[int, str] = {}
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        return out
    for name in names:
        with contextlib.suppress(OSError, ValueError):
            link = os.readlink(f"/proc/self/fd/{name}")
            if link.startswith("socket:["):
                out[int(name)] = link
    return out


class GroupSockets:
    """Call `formed` once the group exists; `end_writes` when leaving it broken."""

    def __init__(self) -> None:
        self._before = set(socket_inodes().values())
        self._owned: dict[int, str] = {}

    def formed(self) -> None:
        """The sockets that appeared since this object was made are the group's."""
        self._owned = {fd: ino for fd, ino in socket_inodes().items() if ino not in self._before}

    def end_writes(self) -> int:
        """Shut the write side of the group's TCP connections still open under the same descriptor and socket;
        returns how many were shut."""
        now = socket_inodes()
        done = 0
        for fd, ino in self._owned.items():
            if now.get(fd) != ino:  # closed since, the number perhaps reused: not ours any more
                continue
            try:
                sock = socket.socket(fileno=os.dup(fd))
            except OSError:
                continue
            try:
                if sock.family in _TCP and sock.type == socket.SOCK_STREAM:
                    sock.shutdown(socket.SHUT_WR)
                    done += 1
            except OSError:  # a listening socket, or one the peer already closed
                pass
            finally:
                sock.close()  # the duplicate only
        self._owned = {}
        return done
