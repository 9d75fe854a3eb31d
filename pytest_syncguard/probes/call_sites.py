"""Call sites: which frames of a Python stack are the user's (outside torch, this plugin and the test runner), and
the innermost of them, resolved once per code position. The sync and race probes both name a call site with it."""

from __future__ import annotations

import importlib.util
import os
import sys
import sysconfig
from types import CodeType, FrameType

from ..analysis.sites import Frame

STACK_DEPTH = 5
#: Where the standard library lies: its frames can be call sites (a thread's target runs from it), never callers
#: worth naming (``subprocess.run``, multiprocessing's bootstrap).
STDLIB = sysconfig.get_paths()["stdlib"] + os.sep


def _package_dir(name: str) -> str | None:
    """The folder of package ``name``, found without importing it (a measured test's child process has no need of
    pytest, whose import took 150 ms of its start); None where it is not installed."""
    module = sys.modules.get(name)
    origin = getattr(module, "__file__", None) if module is not None else None
    if origin is None:
        spec = importlib.util.find_spec(name)
        origin = spec.origin if spec is not None else None
    return os.path.realpath(os.path.dirname(origin)) + os.sep if origin else None


#: Internal code whose presence on the way from a sync to its call site means torch.compile is compiling
#: (dynamo converts a frame there; at run time compiled code never passes through it).
_COMPILER_FILES = (os.path.join("_dynamo", "convert_frame.py"),)

INTERNAL, USER, COMPILER = 0, 1, 2


class _InternalFiles:
    """Decides whether a source file belongs to torch, this plugin or the test runner, by the packages' real
    locations (never by a substring of the path: a project under a folder named ``torch`` is user code), and
    which of torch's files are its compiler's."""

    def __init__(self) -> None:
        torch = _package_dir("torch") or os.devnull
        found = (_package_dir(name) for name in ("pytest_syncguard", "_pytest", "pytest", "pluggy"))
        self._roots = (torch, *(root for root in found if root is not None))
        self._compiler = tuple(torch + name for name in _COMPILER_FILES)
        self._classes: dict[str, int] = {}

    def classify(self, filename: str) -> int:
        """``INTERNAL``, ``USER`` (a call site) or ``COMPILER`` (internal, and torch.compile's compiler)."""
        found = self._classes.get(filename)
        if found is None:
            path = os.path.realpath(filename)
            if filename.startswith("<frozen ") or path.startswith(self._roots):
                found = COMPILER if path in self._compiler else INTERNAL
            else:
                found = USER
            self._classes[filename] = found
        return found

    def __contains__(self, filename: str) -> bool:
        return self.classify(filename) != USER


_INTERNAL = _InternalFiles()


def is_internal_file(filename: str) -> bool:
    """Whether a source file belongs to torch, this plugin or the test runner (not a call site)."""
    return filename in _INTERNAL


#: (id(code), instruction offset) -> (code, its Frame, or None in internal code, whether it is the compiler's):
#: each frame of a loop's stack is classified and resolved once, not once per token. Keyed by id: hashing a code
#: object hashes its bytecode and constants, microseconds per frame; the code is kept, so that its id is not
#: reused.
_FRAMES: dict[tuple[int, int], tuple[CodeType, Frame | None, bool]] = {}


def _resolve(frame: FrameType) -> tuple[CodeType, Frame | None, bool]:
    code = frame.f_code
    verdict = _INTERNAL.classify(code.co_filename)
    if verdict != USER:
        return code, None, verdict == COMPILER
    return code, Frame(code.co_filename, frame.f_lineno, getattr(code, "co_qualname", code.co_name)), False


def code_class(code: CodeType) -> int:
    return _INTERNAL.classify(code.co_filename)


def site_of(code: CodeType, lasti: int) -> Frame:
    """The Frame of user ``code`` paused at instruction offset ``lasti`` (a frame's ``f_lasti``), cached."""
    key = (id(code), lasti)
    cached = _FRAMES.get(key)
    if cached is None or cached[1] is None:
        line = next((line for start, end, line in code.co_lines() if start <= lasti < end and line), None)
        site = Frame(code.co_filename, line or code.co_firstlineno, getattr(code, "co_qualname", code.co_name))
        cached = _FRAMES[key] = (code, site, False)
    return cached[1]  # type: ignore[return-value]


def first_user_frame(frame: FrameType | None) -> tuple[FrameType | None, Frame | None, bool]:
    """The innermost frame from ``frame`` outwards that lies outside torch and this plugin (None: there is
    none), its Frame, and whether a frame of torch.compile's compiler lay on the way."""
    cache = _FRAMES
    compiling = False
    while frame is not None:
        # f_lineno decodes the line table (microseconds in a large function); f_lasti is a plain int.
        key = (id(frame.f_code), frame.f_lasti)
        cached = cache.get(key)
        if cached is None:
            cached = cache[key] = _resolve(frame)
        if cached[1] is not None:
            return frame, cached[1], compiling
        compiling = compiling or cached[2]
        frame = frame.f_back
    return None, None, compiling


def user_stack(frame: FrameType | None, depth: int = STACK_DEPTH) -> tuple[Frame, ...]:
    """The innermost ``depth`` frames from ``frame`` outwards that lie outside torch and this plugin."""
    frames: list[Frame] = []
    while len(frames) < depth:
        found, site, _ = first_user_frame(frame)
        if found is None or site is None:
            break
        frame = found.f_back
        frames.append(site)
    return tuple(frames)
