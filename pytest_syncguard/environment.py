"""The machine a measurement ran on: the device slug that names its baseline file, the environment
fingerprint stored with baselines, and the GPU a pytest-xdist worker takes."""

from __future__ import annotations

import ctypes
import importlib.metadata
import os
import platform
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from functools import cache

from .version import __version__

CPU_SLUG = "cpu"
#: The fingerprint's keys, in the order reports show them.
FINGERPRINT_KEYS = ("device_name", "torch", "cuda", "driver", "transformers", "python", "syncguard")


def device_slug(name: str) -> str:
    """``NVIDIA H100 80GB HBM3`` -> ``nvidia-h100-80gb-hbm3``: the baseline file name of a device."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "unknown"


def is_slug(text: str) -> bool:
    """Whether ``text`` can be a device slug (what :func:`device_slug` makes): never a path."""
    return re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", text) is not None


@cache
def cuda_device_name() -> str | None:
    """The name of the current CUDA device, None without one."""
    import torch

    return torch.cuda.get_device_name() if torch.cuda.is_available() else None


def host_id(slug: str) -> str:
    """Which device a recording of the baseline ``slug`` was made on: the first block of the current CUDA device's
    UUID (``a9dc0a68``), ``cpu`` for the CPU's, empty where the UUID cannot be read."""
    if slug.split("-x")[0] == CPU_SLUG:
        return "cpu"
    import torch

    if not torch.cuda.is_available():
        return ""
    uuid = str(getattr(torch.cuda.get_device_properties(torch.cuda.current_device()), "uuid", "") or "")
    return uuid.removeprefix("GPU-").split("-")[0]


def slug_for(device: str) -> str:
    """The baseline slug of a result measured on ``device`` ("cpu" or "cuda"): the GPU model's, and in a launch of
    several processes (torchrun) its world size after it (``nvidia-h100-80gb-hbm3-x2``), so that runs on 2 and on 8
    GPUs never share a baseline, a history or an A/B."""
    from .ranks import current

    name = cuda_device_name() if device != "cpu" else None
    model = device_slug(name) if name else CPU_SLUG
    launch = current()
    return f"{model}-x{launch.world_size}" if launch is not None else model


def unnamed_slug(device: str) -> str:
    """The slug of a result read from a file that names none (written before every result carried one): "cpu"
    on the CPU; on CUDA the GPU model is not known ("cuda" names no baseline file)."""
    return CPU_SLUG if device == "cpu" else "unknown"


@cache
def _driver_version() -> str | None:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        out = subprocess.run(
            [smi, "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True, text=True, timeout=20
        )
    except (OSError, subprocess.SubprocessError):
        return None
    lines = out.stdout.split()
    return lines[0] if out.returncode == 0 and lines else None


def fingerprint(device: str) -> dict[str, str | None]:
    """What a baseline's numbers depend on besides the code: device, torch, CUDA runtime, driver,
    transformers, Python and syncguard versions (None: not present). A fresh dict; computed once per device."""
    return dict(_fingerprint(device))


#: The CUDA driver's library by platform: torch's CUDA loads it, so a machine where it cannot be loaded has no CUDA
#: device for torch (a CPU runner, or a GPU runner's container started without the driver mounted).
DRIVER_LIBRARY = {"linux": "libcuda.so.1", "win32": "nvcuda.dll"}


@cache
def has_cuda_driver() -> bool:
    """Whether this process can load the CUDA driver's library, told without importing torch (1.1 s of a process
    that only asks which device it is on); True is no promise of a device: ask torch then."""
    name = DRIVER_LIBRARY.get(sys.platform)
    if name is None:
        return False
    try:
        ctypes.CDLL(name)
    except OSError:
        return False
    return True


@cache
def _fingerprint(device: str) -> tuple[tuple[str, str | None], ...]:
    on_cuda = device != "cpu" and cuda_device_name() is not None
    cuda = None
    if on_cuda:
        import torch

        cuda = torch.version.cuda
    return (
        ("device_name", cuda_device_name() if on_cuda else "cpu"),
        ("torch", _installed_version("torch")),
        ("cuda", cuda),
        ("driver", _driver_version() if on_cuda else None),
        ("transformers", _installed_version("transformers")),
        ("python", platform.python_version()),
        ("syncguard", __version__),
    )


def _installed_version(distribution: str) -> str | None:
    """The version of ``distribution`` as the running process has it: the imported module's ``__version__`` where it
    is imported, else the installed distribution's metadata (importing transformers to read it took about 1 s of
    every run that did not use it); None where it is not installed."""
    module = sys.modules.get(distribution)
    if module is not None and isinstance(version := getattr(module, "__version__", None), str):
        return str(version)
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def fingerprint_changes(
    recorded: dict[str, str | None], current: dict[str, str | None]
) -> dict[str, tuple[str | None, str | None]]:
    """The keys whose value differs: ``{key: (recorded, current)}`` (keys missing on either side are skipped)."""
    return {
        key: (recorded[key], current[key])
        for key in FINGERPRINT_KEYS
        if key in recorded and key in current and recorded[key] != current[key]
    }


def visible_gpus() -> list[str]:
    """The GPUs this process may use, without initializing CUDA (which would freeze CUDA_VISIBLE_DEVICES)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [d.strip() for d in visible.split(",") if d.strip()]
    import torch

    try:
        count = torch.cuda._device_count_nvml()  # NVML, not the CUDA runtime: nothing is initialized
    except Exception:
        count = -1
    return [str(i) for i in range(max(count, 0))]


def assign_worker_gpu(worker_id: str, workers: int) -> tuple[str | None, str | None]:
    """Give xdist worker ``gwN`` GPU N modulo the visible GPUs, by narrowing CUDA_VISIBLE_DEVICES before CUDA
    initializes. Returns (the GPU taken or None, a warning or None)."""
    import torch

    match = re.fullmatch(r"gw(\d+)", worker_id)
    if match is None:
        return None, None
    if torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        return None, f"syncguard: worker {worker_id}: CUDA was initialized before the plugin could assign a GPU"
    gpus = visible_gpus()
    if len(gpus) == 0:
        return None, None
    chosen = gpus[int(match.group(1)) % len(gpus)]
    os.environ["CUDA_VISIBLE_DEVICES"] = chosen
    shared = None
    if workers > len(gpus):
        shared = (
            f"syncguard: {workers} xdist workers share {len(gpus)} GPU(s): GPU timeline budgets and timings of "
            "tests running at the same time on one GPU disturb each other"
        )
    return chosen, shared


def available_cores() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


#: Set by the user, these fix the threads of every process: the plugin then leaves torch's as they are.
THREAD_SETTINGS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")


def _threads(value: str) -> bool:
    """Whether a thread setting's value is one OpenMP takes: a whole number of threads, 1 or more."""
    text = value.strip()
    return text.isascii() and text.isdigit() and int(text) >= 1


def share_cores(worker_id: str, workers: int) -> tuple[Callable[[], None], str] | None:
    """Give xdist worker ``worker_id`` its share of the cores for torch's intra-op threads, where ``workers`` of
    them with torch's default threads would oversubscribe the cores (each alone takes all of them: a 20-token CPU
    loop under ``-n 2`` on two cores took 1.4-5.4 s against 20 ms serially). Returns a function that restores the
    threads, and a note that says what was done; None where nothing was changed (the user set
    :data:`THREAD_SETTINGS`, or the share is no smaller)."""
    set_by_user = {name: os.environ[name] for name in THREAD_SETTINGS if os.environ.get(name, "").strip()}
    unusable = {name: value for name, value in set_by_user.items() if not _threads(value)}
    if set_by_user and not unusable:
        return None
    import torch

    cores = available_cores()
    before, share = torch.get_num_threads(), max(1, cores // max(workers, 1))
    if before <= share and not unusable:
        return None
    torch.set_num_threads(min(before, share))
    ignored = "".join(
        f"; {name}={value!r} is not a number of threads (1 or more): ignored" for name, value in unusable.items()
    )
    note = (
        f"syncguard: xdist worker {worker_id}: torch's intra-op threads {before} -> {min(before, share)}, its share of "
        f"{cores} cores among {workers} workers (set OMP_NUM_THREADS to choose them yourself){ignored}"
    )
    return (lambda: torch.set_num_threads(before)), note


#: torch's NCCL process groups time each collective on the device (CUDA events around it) where this is 1, and keep
#: the last :data:`TRACE_VARIABLE` of them in their flight recorder: the collectives' times of a region
#: (:mod:`.probes.collectives`). Both are read when a process group is made.
TIMING_VARIABLE, TRACE_VARIABLE = "TORCH_NCCL_ENABLE_TIMING", "TORCH_NCCL_TRACE_BUFFER_SIZE"
#: The collectives the flight recorder keeps where the user has not said: a region's and more (32 steps of a
#: 32-layer model with two all-reduces a layer are 2,048).
TRACE_SIZE = 4096


def collective_timing(environ: dict[str, str] | os._Environ[str] = os.environ) -> Callable[[], None]:
    """Turn on the timing and the flight recorder of the process groups made from now on, where the user has not
    set :data:`TIMING_VARIABLE` or :data:`TRACE_VARIABLE` (a 0 of theirs is kept: their collectives are then not
    timed, which their waits say). Returns what puts the variables back as they were."""
    wanted = {TIMING_VARIABLE: "1", TRACE_VARIABLE: str(TRACE_SIZE)}
    set_here = [name for name in wanted if name not in environ]
    for name in set_here:
        environ[name] = wanted[name]

    def restore() -> None:
        for name in set_here:
            environ.pop(name, None)

    return restore
