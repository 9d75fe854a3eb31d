"""The native extension: kernels for scalar reads and copies (``kernels.cpp``), the operator counter (``ops.cpp``),
the race probe's access check (``races.cpp``) and the PM sampler's decode loop (``samples.cpp``),
built once per machine and torch version, loaded once per process.

It is built with torch's own extension builder (ninja and a C++ compiler, into ``TORCH_EXTENSIONS_DIR``,
``~/.cache/torch_extensions`` by default; about ten seconds the first time) and loaded from that cache afterwards:
one build per torch version and per checkout and content of the sources, so that two checkouts run in turn
(``syncguard ab``) do not rebuild each other's. Where it cannot be built the sync probe falls back to its Python
kernels, which count the same syncs more slowly, operators are not counted, and :data:`NATIVE` says why.
``SYNCGUARD_NATIVE=0`` skips it; ``SYNCGUARD_NATIVE=1`` makes a failed build an error."""

from __future__ import annotations

import hashlib
import os
import re
import threading
from pathlib import Path
from types import ModuleType

import torch

ENVIRONMENT = "SYNCGUARD_NATIVE"
SOURCES = tuple(str(Path(__file__).with_name(name)) for name in ("kernels.cpp", "ops.cpp", "races.cpp", "samples.cpp"))


class NativeKernelError(RuntimeError):
    """``SYNCGUARD_NATIVE=1`` and the native kernel could not be built or loaded."""


class NativeKernel:
    """Loads the extension at most once per process; remembers why it is unavailable if it is."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tried = False
        self._module: ModuleType | None = None
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

    def load(self) -> ModuleType | None:
        """The extension module, or None when it is switched off or cannot be built here."""
        with self._lock:
            if self._tried:
                return self._module
            setting = self._setting()
            self._tried = True
            if setting == "off":
                self.unavailable = f"switched off by {ENVIRONMENT}=0"
                return None
            try:
                self._module = _build()
            except Exception as exc:  # no compiler, no ninja, no Python headers, an ABI mismatch
                self.unavailable = f"could not be built ({type(exc).__name__}: {_reason(exc)})"
                if setting == "require":
                    raise NativeKernelError(f"syncguard: the native kernels {self.unavailable}") from exc
            return self._module


def _reason(exc: Exception) -> str:
    """The line of a build failure that says what went wrong: the compiler's first error, else the last line."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()] or [type(exc).__name__]
    compiler = [line for line in lines if "error:" in line]
    return (compiler[0] if compiler else lines[-1])[:300]


def _build() -> ModuleType:
    from torch.utils.cpp_extension import load

    # One build per torch version (the kernel links against torch's C++ ABI) and per sources: the builder's
    # ninja file names the sources' paths, so another checkout under the same name would rebuild.
    version = re.sub(r"\W", "_", torch.__version__)
    digest = hashlib.sha256()
    for source in SOURCES:
        digest.update(source.encode() + b"\0" + Path(source).read_bytes())
    # NDEBUG as torch's release builds have it: RecordFunction has a debug-only member without it, and the access
    # check would read the inputs of a class laid out differently from torch's.
    module: ModuleType = load(
        name=f"syncguard_kernels_{version}_{digest.hexdigest()[:12]}", sources=list(SOURCES),
        extra_cflags=["-O2", "-DNDEBUG"], verbose=False,
    )  # fmt: skip
    return module


NATIVE = NativeKernel()
