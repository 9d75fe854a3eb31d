"""pytest-syncguard: budgets on host-device syncs of PyTorch generation loops, enforced as test assertions.

The public names are imported on first use, so that the CLI's ``report`` and ``comment`` (run where torch is
not installed, e.g. on the job that posts PR comments) do not import torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .version import __version__

if TYPE_CHECKING:
    from .analysis.sites import Frame, SyncEvent, SyncSite
    from .budgets import BudgetError
    from .document.budget import Budget, BudgetCheck
    from .document.measured import MeasuredTest
    from .guard import GenerationRegion, SyncGuard, SyncguardUsageError
    from .measurement import Measurement
    from .probes.sync_ops import SyncKind

_PUBLIC = {
    "Frame": ".analysis.sites",
    "SyncEvent": ".analysis.sites",
    "SyncSite": ".analysis.sites",
    "Budget": ".document.budget",
    "BudgetCheck": ".document.budget",
    "BudgetError": ".budgets",
    "GenerationRegion": ".guard",
    "Measurement": ".measurement",
    "SyncGuard": ".guard",
    "SyncguardUsageError": ".guard",
    "MeasuredTest": ".document.measured",
    "SyncKind": ".probes.sync_ops",
}

#: Names of 0.1.0 kept for code that imported them: a measurement and a budget are not only about syncs.
_RENAMED = {"SyncMeasurement": "Measurement", "SyncBudget": "Budget"}

__all__ = [
    "Budget",
    "BudgetCheck",
    "BudgetError",
    "Frame",
    "GenerationRegion",
    "MeasuredTest",
    "Measurement",
    "SyncEvent",
    "SyncGuard",
    "SyncKind",
    "SyncSite",
    "SyncguardUsageError",
    "__version__",
]


def __getattr__(name: str) -> Any:
    name = _RENAMED.get(name, name)
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'pytest_syncguard' has no attribute {name!r}")
    return getattr(importlib.import_module(module, __name__), name)
