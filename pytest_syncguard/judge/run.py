"""A CI run's results: the measured tests of its results files (``--syncguard-json``) or, for runs that wrote
none, its JUnit files, merged, each compared with its baseline.

The cases come from one or several files (xdist, several jobs or GPU models, the ranks of a launch) and are
de-duplicated by (device, node id): the worst case wins (a failure in any file stays), of equals the last read.
Each is compared with its baseline entry: from a baselines folder when one is given, else with the entry the run
itself compared with (``syncguard.baseline.<metric>``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ..analysis.explain import Details
from ..codec import encode
from ..document import file as results_file
from ..document.comparison import Comparison, Drift, Spread
from ..document.measured import PARTIAL
from ..environment import fingerprint_changes
from ..status import JUDGED, Status
from .baselines import Baseline, of_device, path_for, read
from .cases import RunCase
from .comparison import compare
from .history import History
from .history import baseline as history_baseline
from .history import read as read_history
from .junit import read_cases
from .loosened import Loosened, at_commit, loosened


@dataclass(frozen=True)
class CaseComparison:
    case: RunCase
    comparison: Comparison

    @property
    def key(self) -> tuple[str, str]:
        return self.case.device_slug, self.case.nodeid


@dataclass
class RunComparison:
    """Every measured test of a run against its baseline, plus what the baselines have that the run lacks."""

    cases: list[CaseComparison] = field(default_factory=list)
    missing: list[tuple[str, str]] = field(default_factory=list)
    """(device slug, node id) of baseline entries that this run did not measure."""
    environment: dict[str, Drift] = field(default_factory=dict)
    """Per device slug: the fingerprint keys that differ from the baseline's."""
    sources: list[str] = field(default_factory=list)
    loosened: list[Loosened] = field(default_factory=list)
    """The baseline values the head's files loosen against the base's (``base_ref``)."""
    histories: dict[str, History] = field(default_factory=dict)
    """Per device slug, the default branch's history the run was judged against (``history``)."""
    unknown: dict[str, list[str]] = field(default_factory=dict)
    """Per results file written by another version: what in it this version does not know (read without it)."""
    history_unavailable: str | None = None
    """Why the default branch's history could not be read where one was asked for (judged without it)."""
    accepted: str | None = None
    """Why this change's regressions are intended (``report --accept``, a pull request's label): they are reported,
    and do not fail the run."""

    def with_status(self, status: str) -> list[CaseComparison]:
        return [c for c in self.cases if c.comparison.status == status]

    @property
    def devices(self) -> list[str]:
        return sorted({c.case.device_slug for c in self.cases})

    @property
    def failed_tests(self) -> list[CaseComparison]:
        """Tests that failed for another reason than a regression (a budget, an error). A test the run failed only
        as a regression against the baseline it compared with is judged again here, against this report's
        baseline (:attr:`rejudged`), not counted as failed."""
        return [
            c
            for c in self.cases
            if c.case.outcome in ("failed", "error")
            and c.comparison.status != Status.REGRESSION
            and c.case.verdict != Status.REGRESSION
        ]

    @property
    def rejudged(self) -> list[CaseComparison]:
        """Tests the run failed as regressions against its baseline that this report, judging against another
        (a history, the merge base's files, other options), finds not regressed."""
        return [
            c for c in self.cases if c.case.verdict == Status.REGRESSION and c.comparison.status != Status.REGRESSION
        ]

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
                    "verdict": c.case.verdict,
                    "metrics": dict(c.case.metrics.values),
                    "comparison": encode(c.comparison),
                }
                for c in self.cases
            ],
            "missing": [{"device": d, "nodeid": n} for d, n in self.missing],
            "environment": self.environment,
            "unknown": self.unknown,
        }


def read_run(paths: Sequence[Path], unknown: dict[str, list[str]] | None = None) -> list[RunCase]:
    """The measured tests of JUnit files, then of results files (``.json``; the ranks of a launch joined,
    :func:`..document.launch.join`); ``ResultsError`` or ``JUnitError`` naming the file when one is neither. What a
    results file holds that this version does not know goes into ``unknown``, under the file's path."""
    junit = [case for path in paths if path.suffix != ".json" for case in read_cases(path, unknown)]
    documents = [path for path in paths if path.suffix == ".json"]
    return junit + [RunCase.of(result) for result in results_file.read_all(documents, unknown)]


def _severity(case: RunCase) -> int:
    """How badly a case went: failed (a budget, an error, a regression) 2, measured 1, skipped 0."""
    if case.broken or case.outcome in ("failed", "error") or case.baseline_status == Status.REGRESSION:
        return 2
    return 0 if case.outcome == "skipped" else 1


def merge_cases(paths: Sequence[Path], unknown: dict[str, list[str]] | None = None) -> list[RunCase]:
    """The cases of all files, one per (device, node id), in a stable order; the ranks of a launch are one case
    each. A test in several files (shards that ran it twice, a results file and its JUnit file) keeps its worst
    case: a failure in any file is never dropped, whatever the order of the files; of equals, a results file's over
    a JUnit file's (it carries the details that explain a change), else the last file's."""
    merged: dict[tuple[str, str], RunCase] = {}
    for case in read_run(paths, unknown):
        key = (case.device_slug, case.nodeid)
        if key not in merged or _severity(case) >= _severity(merged[key]):
            merged[key] = case
    return [merged[key] for key in sorted(merged)]


def compare_run(
    paths: Sequence[Path],
    baselines: Path | None,
    tolerance: float | None = None,
    host_timings: bool = False,
    base_ref: str | None = None,
    history: Path | None = None,
) -> RunComparison:
    """Compare every measured case of the files; raises ``ResultsError``/``JUnitError``/``BaselineError`` naming a
    file. Host timings are judged where ``host_timings`` says so, or where the run judged them. With ``base_ref``
    (a commit of the working directory's repository), the baselines are that commit's files of the ``baselines``
    folder, and what the working tree's files loosen against them is kept in :attr:`RunComparison.loosened`. With
    ``history`` (a folder of the default branch's history, :mod:`.history`), a GPU model's history is its baseline
    where it has one; the ``baselines`` folder stands in for the models it has none of."""
    run = RunComparison(sources=[str(p) for p in paths])
    files: dict[str, Baseline | None] = {}
    for case in merge_cases(paths, run.unknown):
        slug = case.device_slug
        within = tolerance if tolerance is not None else case.tolerance
        recorded: Details | None = None
        if baselines is not None or history is not None:
            folder = path_for(baselines, slug) if baselines is not None else None
            if slug not in files:
                files[slug] = _judging(folder, base_ref, run, history, slug)
            baseline = files[slug]
            path = baseline.path if baseline is not None else folder or Path(f"{slug}.json")
            entry: Mapping[str, float] | None
            entry, spreads = baseline.reference(case.nodeid, case.host) if baseline is not None else (None, {})
            drift = fingerprint_changes(baseline.fingerprint, case.fingerprint) if baseline is not None else {}
            recorded = baseline.details.get(case.nodeid) if baseline is not None else None
        else:
            path = Path(f"{slug}.json")
            entry = case.baseline_values if case.compared else None
            drift = case.drift
            spreads = dict(case.spreads)
        if case.verdict in PARTIAL or case.verdict == "error":  # partial numbers, or none: never compared
            run.cases.append(CaseComparison(case, Comparison(slug, str(path), "not compared", (), within)))
            continue
        if drift:
            run.environment.setdefault(slug, drift)
        if _judged_alike(case, entry, spreads, tolerance, host_timings):
            assert case.comparison is not None
            run.cases.append(CaseComparison(case, case.comparison))  # judged once: by the run, against this entry
            continue
        comparison = compare(
            entry,
            case.metrics,
            device=slug,
            file=str(path),
            tolerance=within,
            fingerprint=case.fingerprint,
            drift=drift,
            host_timings=host_timings or case.host_timings,
            details=(recorded, case.details),
            spreads=spreads,
        )
        if baselines is None and not comparison.explanation and case.explanation:
            # Without the baseline's details, what the run itself found changed (the results document keeps it).
            comparison = replace(comparison, explanation=case.explanation)
        run.cases.append(CaseComparison(case, comparison))
    seen = {c.key for c in run.cases}
    for slug, baseline in sorted(files.items()):
        if baseline is not None:
            run.missing.extend((slug, nodeid) for nodeid in sorted(baseline.tests) if (slug, nodeid) not in seen)
    return run


def _judged_alike(
    case: RunCase,
    entry: Mapping[str, float] | None,
    spreads: Mapping[str, Spread],
    tolerance: float | None,
    host_timings: bool,
) -> bool:
    """Whether the run already judged ``case`` as this report would: against the same baseline entry (its values
    and spreads), with no other tolerance or host timings asked for here. Then its judgement stands, never made
    twice; a report against another entry (the default branch's history, the merge base's files) judges anew."""
    recorded = case.comparison
    if recorded is None or recorded.status not in JUDGED or entry is None:
        return False
    asked_other = tolerance is not None or (host_timings and not recorded.host_timings)
    return not asked_other and dict(entry) == dict(case.baseline_values) and dict(spreads) == dict(case.spreads)


def _judging(
    path: Path | None, base_ref: str | None, run: RunComparison, history: Path | None, slug: str
) -> Baseline | None:
    """The baseline a run is judged against: the GPU model's ``history`` where it has one, else ``path``, or with
    ``base_ref`` that commit's version of it (what the working tree's file loosens against it goes into ``run``)."""
    if history is not None:
        found = read_history(history, slug)
        if found is not None:
            run.histories[slug] = found
            return history_baseline(found)
    if path is None:
        return None
    if base_ref is None:
        return of_device(read(path), slug)
    base, head = of_device(at_commit(Path.cwd(), base_ref, path), slug), of_device(read(path), slug)
    if base is not None:
        run.loosened.extend(loosened(base, head or Baseline(path, base.device, {}, {})))
    return base
