"""A CI run's verdicts: the measured test cases of its JUnit files, merged, against baselines.

The cases come from one or several JUnit files (xdist, several jobs or GPU models) and are de-duplicated by
(node id, device): the last file read wins. Each is compared with its baseline entry: from a baselines folder
when one is given, else with the values the run itself compared with (``syncguard.baseline.<metric>``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ..baselines import DEFAULT_TOLERANCE, Baseline, Comparison, compare, path_for, read
from .junit import JUnitCase, read_cases


@dataclass(frozen=True)
class CaseVerdict:
    case: JUnitCase
    comparison: Comparison

    @property
    def key(self) -> tuple[str, str]:
        return self.case.device_slug, self.case.nodeid


@dataclass
class RunVerdicts:
    """Every measured test of a run against its baseline, plus what the baselines have that the run lacks."""

    cases: list[CaseVerdict] = field(default_factory=list)
    missing: list[tuple[str, str]] = field(default_factory=list)
    """(device slug, node id) of baseline entries that this run did not measure."""
    environment: dict[str, dict[str, list[str | None]]] = field(default_factory=dict)
    """Per device slug: the fingerprint keys that differ from the baseline's."""
    sources: list[str] = field(default_factory=list)

    def with_status(self, status: str) -> list[CaseVerdict]:
        return [c for c in self.cases if c.comparison.status == status]

    @property
    def devices(self) -> list[str]:
        return sorted({c.case.device_slug for c in self.cases})

    @property
    def failed_tests(self) -> list[CaseVerdict]:
        """Tests that failed for another reason than a regression (a budget, an error)."""
        return [c for c in self.cases if c.case.outcome in ("failed", "error") and c.comparison.status != "regression"]

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": "pytest-syncguard/report",
            "schema_version": 1,
            "sources": self.sources,
            "devices": self.devices,
            "tests": [
                {
                    "nodeid": c.case.nodeid,
                    "device": c.case.device_slug,
                    "outcome": c.case.outcome,
                    "verdict": c.case.properties.get("verdict"),
                    "metrics": c.case.metrics,
                    "comparison": c.comparison.to_dict(),
                }
                for c in self.cases
            ],
            "missing": [{"device": d, "nodeid": n} for d, n in self.missing],
            "environment": self.environment,
        }


def merge_cases(paths: Sequence[Path]) -> list[JUnitCase]:
    """The cases of all files, one per (device, node id), in a stable order."""
    merged: dict[tuple[str, str], JUnitCase] = {}
    for path in paths:
        for case in read_cases(path):
            merged[(case.device_slug, case.nodeid)] = case
    return [merged[key] for key in sorted(merged)]


def _samples(case: JUnitCase) -> dict[str, int]:
    samples = {}
    for name in case.metrics:
        raw = case.properties.get(f"runs.{name}", "1")
        samples[name] = int(raw) if raw.isdigit() else 1
    return samples


def _fingerprint(case: JUnitCase) -> dict[str, str | None]:
    try:
        data = json.loads(case.properties.get("fingerprint", "{}"))
    except json.JSONDecodeError:
        return {}
    return {str(k): None if v is None else str(v) for k, v in data.items()} if isinstance(data, dict) else {}


def _recorded_drift(case: JUnitCase) -> dict[str, list[str | None]]:
    """The fingerprint changes the run itself found (``syncguard.fingerprint_changes``)."""
    try:
        data = json.loads(case.properties.get("fingerprint_changes", "{}"))
    except json.JSONDecodeError:
        return {}
    if not isinstance(data, dict):
        return {}
    return {
        str(k): [None if x is None else str(x) for x in v]
        for k, v in data.items()
        if isinstance(v, list) and len(v) == 2
    }


def _tolerance(case: JUnitCase, default: float | None) -> float:
    if default is not None:
        return default
    try:
        return float(case.properties.get("tolerance", DEFAULT_TOLERANCE))
    except ValueError:
        return DEFAULT_TOLERANCE


def judge(paths: Sequence[Path], baselines: Path | None, tolerance: float | None = None) -> RunVerdicts:
    """Compare every measured case of the JUnit files; raises ``JUnitError``/``BaselineError`` naming a file."""
    cases = merge_cases(paths)
    run = RunVerdicts(sources=[str(p) for p in paths])
    files: dict[str, Baseline | None] = {}
    for case in cases:
        slug = case.device_slug
        if baselines is not None:
            path = path_for(baselines, slug)
            if slug not in files:
                files[slug] = read(path)
            baseline = files[slug]
        else:
            path = Path(f"{slug}.json")
            known = case.properties.get("baseline") not in (None, "new")
            baseline = Baseline(path, slug, {}, {case.nodeid: case.baseline} if known else {})
        comparison = compare(
            baseline, slug, path, case.nodeid, case.metrics, _samples(case), _tolerance(case, tolerance),
            _fingerprint(case) if baselines is not None else {},
        )  # fmt: skip
        if baselines is None:
            comparison = replace(comparison, fingerprint_changes=_recorded_drift(case))
        if comparison.fingerprint_changes:
            run.environment.setdefault(slug, comparison.fingerprint_changes)
        run.cases.append(CaseVerdict(case, comparison))
    seen = {c.key for c in run.cases}
    for slug, baseline in sorted(files.items()):
        if baseline is not None:
            run.missing.extend((slug, nodeid) for nodeid in sorted(baseline.tests) if (slug, nodeid) not in seen)
    return run


def regressions(run: RunVerdicts) -> Iterable[tuple[CaseVerdict, Any]]:
    for verdict in run.with_status("regression"):
        for change in verdict.comparison.of("regression"):
            yield verdict, change
