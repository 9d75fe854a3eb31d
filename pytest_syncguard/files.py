"""Writing files so that a reader sees the old file or the whole new one, never a part; holding a file's lock
against other processes, a Ctrl-C during the wait a clean KeyboardInterrupt; checking, before a run starts, that the
paths it will write can be written; and that a file from untrusted hands may be read."""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import signal
import stat
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from filelock import FileLock, Timeout

_LOG = logging.getLogger("pytest_syncguard")
#: How often a wait for another run's lock tries it again.
LOCK_POLL_S = 0.05


def _mode_for(path: Path) -> int:
    """The permission bits the written file gets: the existing file's, else what the umask leaves of 0o666 (as
    ``open()`` would give a new file)."""
    try:
        return stat.S_IMODE(path.stat().st_mode)
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


def write_atomically(path: Path, text: str) -> None:
    """Write ``text`` to a temporary file beside ``path``, flush it to disk and rename it over ``path``. The file
    keeps its mode (a new one gets the umask's), not the private mode of the temporary file. A ``path`` that is
    there and is no regular file (a device such as /dev/stdout, a FIFO, a symbolic link) is an OSError: the rename
    would put a file in its place."""
    if (problem := _not_regular(path)) is not None:
        raise OSError(problem)
    path.parent.mkdir(parents=True, exist_ok=True)
    mode = _mode_for(path)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as sink:
            sink.write(text)
            sink.flush()
            os.fchmod(sink.fileno(), mode)
            os.fsync(sink.fileno())
        os.replace(temporary, path)
    except BaseException:
        # Interrupted after the rename, the temporary file is the new ``path``: nothing to remove, and the
        # interrupt (not a FileNotFoundError that says the write failed) is what goes on.
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise


def lock_path(path: Path) -> Path:
    """Where the lock of ``path`` lies: in the temporary folder, named by ``path``'s absolute path, so that no lock
    file is left beside it in the user's working tree (every process of the machine finds the same one)."""
    digest = hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / f"syncguard-{path.name}-{digest}.lock"


@contextlib.contextmanager
def _interrupt_deferred() -> Iterator[list[int]]:
    """In the block, SIGINT only notes that it came (the list it yields gets its number); on exit the handler
    before it is back. No KeyboardInterrupt is thrown into whatever library code the block is running (filelock's
    own bookkeeping, between any two of its bytecodes): the caller acts on the note at a point of its own. Outside
    the main thread, or where SIGINT is not Python's own KeyboardInterrupt, the block runs as it is."""
    came: list[int] = []
    previous = signal.getsignal(signal.SIGINT) if threading.current_thread() is threading.main_thread() else None
    if previous is not signal.default_int_handler:
        yield came
        return
    signal.signal(signal.SIGINT, lambda signum, frame: came.append(signum))
    try:
        yield came
    finally:
        signal.signal(signal.SIGINT, previous)


@contextlib.contextmanager
def held_lock(path: Path, timeout_s: float) -> Iterator[None]:
    """Hold the lock of ``path`` (:func:`lock_path`) in the block, waiting at most ``timeout_s`` for another process
    that holds it (filelock's :class:`~filelock.Timeout` past it). Ctrl-C while waiting is a KeyboardInterrupt
    raised here, between two tries, and the lock is not held; the wait is logged on the ``pytest_syncguard``
    logger (INFO once, then DEBUG at each try)."""
    lock = FileLock(str(lock_path(path)))
    deadline = time.monotonic() + timeout_s
    waited = False
    with _interrupt_deferred() as came:
        while True:
            with contextlib.suppress(Timeout):
                lock.acquire(blocking=False)
            if came:
                if lock.is_locked:
                    lock.release()
                break
            if lock.is_locked:
                break
            if time.monotonic() > deadline:
                raise Timeout(lock.lock_file)
            say = _LOG.debug if waited else _LOG.info
            say("waiting for %s: another run holds the lock of %s", lock.lock_file, path)
            waited = True
            time.sleep(LOCK_POLL_S)
    if came:
        raise KeyboardInterrupt
    try:
        yield
    finally:
        lock.release()


IGNORE_ALL = "# Written by pytest-syncguard: nothing here is tracked.\n*\n"


def ignored_folder(folder: Path) -> Path:
    """``folder``, made if needed, holding a ``.gitignore`` that ignores everything in it (git status then does
    not list what the tool writes there). A folder that holds anything else and is not one this function made (a
    checkout, ``.``) is a ValueError: the tool would ignore and replace what is in it."""
    if folder.is_dir() and any(folder.iterdir()) and not _ours(folder):
        raise ValueError(f"{folder} holds files pytest-syncguard did not write: give a new or empty folder")
    folder.mkdir(parents=True, exist_ok=True)
    ignore = folder / ".gitignore"
    if not ignore.exists():
        ignore.write_text(IGNORE_ALL, encoding="utf-8")
    return folder


def _ours(folder: Path) -> bool:
    try:
        return (folder / ".gitignore").read_text(encoding="utf-8") == IGNORE_ALL
    except (OSError, UnicodeDecodeError):
        return False


def _not_regular(path: Path) -> str | None:
    """Why a file must not be written over ``path``: it is a symbolic link, or there and not a regular file."""
    if path.is_symlink():
        return f"{path} is a symbolic link: give the path of a file"
    if path.exists() and not path.is_file():
        return f"{path} is not a regular file: give the path of a file"
    return None


def small_regular_file(path: Path, limit: int) -> bool:
    """Whether ``path`` is a regular file (not a symbolic link, a FIFO or a device) of at most ``limit`` bytes: one
    that may be read whole, wherever it came from."""
    return path.is_file() and not path.is_symlink() and path.stat().st_size <= limit


def _existing_ancestor(path: Path) -> Path:
    for candidate in (path, *path.parents):
        if candidate.exists():
            return candidate
    return Path(path.anchor or ".")


def _writable_folder(folder: Path) -> str | None:
    """Why files cannot be made in ``folder`` (or in the folders that would be made for it), if so: the nearest
    existing folder is tried with a file made and removed (a permission check passes for root where the file
    system refuses, as /proc does)."""
    existing = _existing_ancestor(folder)
    if not existing.is_dir():
        return f"{existing} is not a folder"
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"{existing} is not writable"
    try:
        handle, name = tempfile.mkstemp(dir=existing, prefix=".syncguard-probe-")
    except OSError as exc:
        return f"no file can be made in {existing} ({exc.strerror or exc})"
    os.close(handle)
    os.unlink(name)
    return None


def folder_problem(path: Path) -> str | None:
    """Why ``path`` cannot be used as a folder to write files into, if so."""
    if path.exists() and not path.is_dir():
        return f"{path} exists and is not a folder"
    return _writable_folder(path)


def file_problem(path: Path) -> str | None:
    """Why a file cannot be written (or replaced) at ``path``, if so."""
    if path.is_dir():
        return f"{path} is a folder"
    return _not_regular(path) or _writable_folder(path.parent)


#: The most bytes a file is unpacked to by default (1 GiB): a trace of a 100-step GPT-2 decode is about 60 MB, and
#: a 2 MB gzip can unpack to 2 GiB.
MAX_UNPACKED_BYTES = 1 << 30


class TooLarge(Exception):
    """A file that unpacks to more than the limit; the message names the file, the limit and how to raise it."""


def read_unpacked(path: Path, limit: int | None = MAX_UNPACKED_BYTES, raise_with: str = "") -> bytes:
    """The bytes of ``path``, gunzipped when it is gzip. No more than ``limit`` bytes are unpacked (None: no limit):
    a file that unpacks to more raises :class:`TooLarge` naming ``raise_with`` (how to raise the limit), having held
    no more than the limit."""
    import gzip

    with path.open("rb") as raw:
        gzipped = raw.read(2) == b"\x1f\x8b"
    opener = gzip.open if gzipped else open
    with opener(path, "rb") as source:
        data = source.read(-1 if limit is None else limit + 1)
    if limit is not None and len(data) > limit:
        how = f" ({raise_with} raises the limit)" if raise_with else ""
        what = "unpacks to" if gzipped else "holds"
        raise TooLarge(f"{path}: {what} more than {limit >> 20} MB{how}")
    return data
