"""pytest-syncguard: budgets on host-device syncs of PyTorch generation loops, enforced as test assertions.

The public names are imported on first use, so that the CLI's ``report`` and ``comment`` (run where torch is
not installed, e.g. on the job that posts PR comments) do not import torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from .analysis.sites import Frame, SyncEvent, SyncSite
    from .budgets import BudgetError, SyncBudget, Verdict
    from .guard import GenerationRegion, SyncGuard, SyncguardUsageError, SyncMeasurement
    from .probes.sync_ops import SyncKind

_PUBLIC = {
    "Frame": ".analysis.sites",
    "SyncEvent": ".analysis.sites",
    "SyncSite": ".analysis.sites",
    "BudgetError": ".budgets",
    "SyncBudget": ".budgets",
    "Verdict": ".budgets",
    "GenerationRegion": ".guard",
    "SyncGuard": ".guard",
    "SyncguardUsageError": ".guard",
    "SyncMeasurement": ".guard",
    "SyncKind": ".probes.sync_ops",
}

__all__ = [
    "BudgetError",
    "Frame",
    "GenerationRegion",
    "SyncBudget",
    "SyncEvent",
    "SyncGuard",
    "SyncKind",
    "SyncMeasurement",
    "SyncSite",
    "SyncguardUsageError",
    "Verdict",
    "__version__",
]


def __getattr__(name: str) -> Any:
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'pytest_syncguard' has no attribute {name!r}")
    return getattr(importlib.import_module(module, __name__), name)
