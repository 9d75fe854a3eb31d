"""The line between ``syncguard ab`` and a side's warm pytest (:mod:`.ab_worker`): one JSON object per line, each
way over a pipe of its own. POSIX only, as the A/B's process groups are."""

from __future__ import annotations

import fcntl
import json
import os
import select
import stat
import time
from contextlib import suppress
from typing import Any

#: The option that makes a pytest process a warm side: ``--syncguard-ab-worker=READ_FD,WRITE_FD``.
WORKER_OPTION = "--syncguard-ab-worker"
#: The environment variable naming the file a warm side writes its threads' stacks to on SIGUSR2.
STACKS_ENV = "SYNCGUARD_AB_STACKS"


class ChannelClosed(Exception):
    """The other end is gone (its process ended) or sent something that is not a message."""


class Channel:
    """Messages (JSON objects) written to one file descriptor and read from another."""

    def __init__(self, read_fd: int, write_fd: int) -> None:
        self.read_fd, self.write_fd = read_fd, write_fd
        self._pending = b""

    @classmethod
    def of_option(cls, value: str) -> Channel:
        """The channel ``--syncguard-ab-worker READ_FD,WRITE_FD`` names; ValueError if it names none."""
        try:
            read_fd, write_fd = (int(part) for part in value.split(","))
        except ValueError:
            raise ValueError(f"{WORKER_OPTION} {value!r}: give two file descriptors, READ,WRITE") from None
        if read_fd == write_fd or min(read_fd, write_fd) <= 2:
            raise ValueError(
                f"{WORKER_OPTION} {value!r}: two pipes' descriptors, not one twice nor stdin, stdout "
                "or stderr (syncguard ab passes them)"
            )
        for fd, mode in ((read_fd, os.O_WRONLY), (write_fd, os.O_RDONLY)):
            try:
                found = os.fstat(fd)
                access = fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE
            except (OSError, OverflowError):  # OverflowError: no C int, so no descriptor
                raise ValueError(f"{WORKER_OPTION} {value!r}: file descriptor {fd} is not open") from None
            if not stat.S_ISFIFO(found.st_mode) or access == mode:
                way = "read" if mode == os.O_WRONLY else "written"
                raise ValueError(
                    f"{WORKER_OPTION} {value!r}: file descriptor {fd} is not a pipe to be {way} "
                    "(syncguard ab passes them)"
                )
        return cls(read_fd, write_fd)

    def send(self, message: dict[str, Any]) -> None:
        data = (json.dumps(message, allow_nan=False) + "\n").encode()
        try:
            while data:
                data = data[os.write(self.write_fd, data) :]
        except BrokenPipeError as exc:
            raise ChannelClosed("the other end closed its pipe") from exc

    def receive(self, timeout: float | None = None) -> dict[str, Any]:
        """The next message; TimeoutError after ``timeout`` seconds without one, ChannelClosed at its end."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while b"\n" not in self._pending:
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0 or not select.select([self.read_fd], [], [], left)[0]:
                    raise TimeoutError
            chunk = os.read(self.read_fd, 65536)
            if not chunk:
                raise ChannelClosed("the other end closed its pipe")
            self._pending += chunk
        line, self._pending = self._pending.split(b"\n", 1)
        try:
            message = json.loads(line)
        except ValueError as exc:
            raise ChannelClosed(f"not a message: {line[:200]!r}") from exc
        if not isinstance(message, dict):
            raise ChannelClosed(f"not a message: {line[:200]!r}")
        return message

    def close(self) -> None:
        for fd in {self.read_fd, self.write_fd}:
            with suppress(OSError):
                os.close(fd)
