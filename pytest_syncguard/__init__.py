"""pytest-syncguard: budgets on host-device syncs of PyTorch generation loops, enforced as test assertions."""

from __future__ import annotations

__version__ = "0.1.0"

from .analysis.sites import Frame, SyncEvent, SyncSite
from .budgets import BudgetError, SyncBudget, Verdict
from .guard import GenerationRegion, SyncGuard, SyncguardUsageError, SyncMeasurement
from .probes.sync_ops import SyncKind

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
