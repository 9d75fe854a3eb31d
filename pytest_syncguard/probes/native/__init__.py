"""The native extension: kernels for scalar reads and copies (``kernels.cpp``), the operator counter (``ops.cpp``),
the race probe's access check (``races.cpp``), the PM sampler's decode loop (``samples.cpp``) and the launch log
(``launches.cpp``), built once per machine and torch installation, loaded once per process.

It is built with torch's own extension builder (ninja and a C++ compiler, into ``TORCH_EXTENSIONS_DIR``,
``~/.cache/torch_extensions`` by default), as one translation unit (``extension.cpp`` includes the four sources, so
torch's headers are compiled once: about 16 s of CPU on the 2-core machine), and loaded from that cache afterwards:
one build per torch installation and content of the sources, whatever checkout they lie in (the builder is given
copies of them in its cache, named by their content: its ninja file names the sources' paths). Where it cannot be
built the sync probe falls back to its Python kernels, which count the same syncs more slowly, operators are not
counted, and :data:`NATIVE` says why.
``SYNCGUARD_NATIVE=0`` skips it; ``SYNCGUARD_NATIVE=1`` makes a failed build an error."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import sys
import threading
from pathlib import Path
from types import ModuleType

import torch

ENVIRONMENT = "SYNCGUARD_NATIVE"
#: The sources, the first the one the builder compiles (it includes the others).
SOURCES = tuple(
    str(Path(__file__).with_name(name))
    for name in ("extension.cpp", "kernels.cpp", "launches.cpp", "ops.cpp", "races.cpp", "samples.cpp")
)


class NativeKernelError(RuntimeError):
    """``SYNCGUARD_NATIVE=1`` and the native kernel could not be built or loaded."""


class NativeKernel:
    """Loads the extension at most once per process; remembers why it is unavailable if it is."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tried = False
        self._module: ModuleType | None = None
        self._error: NativeKernelError | None = None
        self.unavailable: str | None = None

    def _setting(self) -> str:
        value = os.environ.get(ENVIRONMENT, "auto").strip().lower()
        if value in ("", "auto"):
            return "auto"
        if value in ("0", "off", "false", "no"):
            return "off"
        if value in ("1", "on", "true", "yes", "require"):
            return "require"
        raise NativeKernelError(f"{ENVIRONMENT}={os.environ[ENVIRONMENT]!r}: expected auto, 0 or 1")

    def switch_off(self, reason: str) -> None:
        """Use the Python kernels in this process from now on (a child process, whose syncs are written as they
        happen), saying ``reason``."""
        with self._lock:
            self._tried, self._module, self._error, self.unavailable = True, None, None, reason

    def load_from(self, path: str) -> tuple[ModuleType | None, str]:
        """The extension another process loaded (a child process's, from the test process's ``path``: the same
        build, imported without the builder, whose start should not wait for hashing, ninja or a compiler), or None
        and why not. The sync probe's kernels are not taken from it (:meth:`switch_off`)."""
        if self._setting() == "off":
            return None, f"is switched off by {ENVIRONMENT}=0"
        if self._module is not None:  # a forked child: its parent's, loaded already
            return self._module, ""
        if not path:
            return None, "is not loaded in the test's process (switched off there, or not built)"
        name = Path(path).name.split(".")[0]
        if (module := sys.modules.get(name)) is not None:
            return module, ""
        try:
            spec = importlib.util.spec_from_file_location(name, path)
            assert spec is not None and spec.loader is not None, path
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
        except Exception as exc:  # removed since, or built for another torch
            return None, f"could not be loaded from {path} ({type(exc).__name__}: {_reason(exc)})"
        sys.modules[name] = module
        return module, ""

    def load(self) -> ModuleType | None:
        """The extension module, or None when it is switched off or cannot be built here (under
        ``SYNCGUARD_NATIVE=1`` a failed build raises, on every call)."""
        with self._lock:
            if self._tried:
                if self._error is not None:
                    raise self._error
                return self._module
            setting = self._setting()
            self._tried = True
            if setting == "off":
                self.unavailable = f"switched off by {ENVIRONMENT}=0"
                return None
            try:
                name = _name()  # the sources read and hashed once
                if not _built(name):
                    # To the terminal itself: a test's call, where the first region loads it, captures sys.stderr.
                    print(
                        "syncguard: building the native kernels (once per machine, torch installation and sources)",
                        file=sys.__stderr__,
                    )
                self._module = _build(name)
            except Exception as exc:  # no compiler, no ninja, no Python headers, an ABI mismatch
                self.unavailable = f"could not be built ({type(exc).__name__}: {_reason(exc)})"
                if setting == "require":
                    self._error = NativeKernelError(f"syncguard: the native kernels {self.unavailable}")
                    raise self._error from exc
            return self._module


def _reason(exc: Exception) -> str:
    """The line of a build failure that says what went wrong: the compiler's first error, or the shell's word that
    a program is missing, else the last line."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()] or [type(exc).__name__]
    telling = [line for line in lines if "error:" in line or line.endswith(("not found", "No such file or directory"))]
    return (telling[0] if telling else lines[-1])[:300]


#: What the extension feeds, for a note where it could not be built: what is slower, and what is not measured.
FEEDS = (
    "scalar reads and copies were counted by the Python kernels (same counts, slower); operators were not counted "
    "(ops and ops_per_token read not measured, their budgets too); sampled GPU timelines were decoded in Python "
    "(about 7 us a sample)"
)
#: How to get the extension built.
FIX = (
    "install a C++ compiler and ninja (pip install ninja), or point CXX at one; SYNCGUARD_NATIVE=1 makes a failed "
    "build an error"
)


def _name() -> str:
    """The extension's name: one build per torch version (the kernel links against torch's C++ ABI), per torch
    installation (the build names its headers and libraries by their paths: two virtual environments sharing one
    build rebuilt it at each switch, about 45 s of CPU on the 2-core machine) and per content of the sources (not
    their paths: :func:`_sources`)."""
    version = re.sub(r"\W", "_", torch.__version__)
    digest = hashlib.sha256(str(Path(torch.__file__).resolve().parent).encode() + b"\0")
    for source in SOURCES:
        digest.update(Path(source).name.encode() + b"\0" + Path(source).read_bytes())
    return f"syncguard_kernels_{version}_{digest.hexdigest()[:12]}"


def _sources(name: str) -> list[str]:
    """Copies of the sources in the builder's cache, beside the build of ``name`` (named by their content), for the
    builder to name in its ninja file: the same paths from every checkout, so none rebuilds another's build. The
    sources where they are, where the cache cannot be found. The first is the one to compile."""
    from ...files import write_atomically

    try:
        from torch.utils.cpp_extension import _get_build_directory

        folder = Path(_get_build_directory(name, verbose=False)).parent / f"{name}_sources"
    except Exception:  # a private function of torch's: another release may lack it
        return list(SOURCES)
    copies = []
    for source in SOURCES:
        copy, text = folder / Path(source).name, Path(source).read_text(encoding="utf-8")
        if not copy.is_file() or copy.read_text(encoding="utf-8") != text:
            write_atomically(copy, text)  # xdist workers building at once see a whole file or none
        copies.append(str(copy))
    return copies


def _built(name: str) -> bool:
    """Whether extension ``name`` lies built in the builder's cache (loading it then takes no compiler); True where
    the builder's folder cannot be found (then nothing is said before the build)."""
    try:
        from torch.utils.cpp_extension import _get_build_directory

        return any(Path(_get_build_directory(name, verbose=False)).glob("*.so"))
    except Exception:  # a private function of torch's: another release may lack it
        return True


def _build(name: str) -> ModuleType:
    from torch.utils.cpp_extension import load

    # NDEBUG as torch's release builds have it: RecordFunction has a debug-only member without it, and the access
    # check would read the inputs of a class laid out differently from torch's.
    unit = _sources(name)[0]
    module: ModuleType = load(name=name, sources=[unit], extra_cflags=["-O2", "-DNDEBUG"], verbose=False)
    return module


NATIVE = NativeKernel()
