"""pytest hooks only: options, markers, the fixture, and attaching verdicts to the test's own report.

torch is imported lazily, when a test is measured, so that having the plugin installed costs nothing to
pytest runs that do not use it.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from .budgets import BUDGET_MARKERS, BudgetError, SyncBudget, TestOptions, budgets_for, marker_help, options_for
from .budgets import syncguard as syncguard_marker

if TYPE_CHECKING:
    from .guard import SyncGuard, SyncMeasurement
    from .report.results import TestResult

_BUDGETS = pytest.StashKey["tuple[SyncBudget, ...]"]()
_OPTIONS = pytest.StashKey[TestOptions]()
_GUARD = pytest.StashKey["SyncGuard"]()
_RESULT = pytest.StashKey["TestResult"]()
REPORT_ATTRIBUTE = "syncguard_result"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("syncguard", "host-device sync budgets (pytest-syncguard)")
    group.addoption(
        "--syncguard",
        action="store_true",
        default=None,
        help="measure every test that uses the syncguard fixture or a budget marker and print a summary table "
        "(budget markers are enforced with or without this option)",
    )
    group.addoption("--syncguard-json", metavar="PATH", default=None, help="write the measured results to PATH as JSON")
    group.addoption(
        "--syncguard-artifacts",
        metavar="DIR",
        default=None,
        help="keep the GPU trace (Chrome/Perfetto JSON, gzipped) and allocator snapshot of each failing test in DIR",
    )
    group.addoption(
        "--syncguard-require-gpu",
        action="store_true",
        default=False,
        help="a budget that needs CUDA (GPU timeline, allocator) fails on a run without it, instead of being "
        "reported as not measured",
    )
    parser.addini("syncguard", type="bool", default=False, help="as --syncguard")


def pytest_configure(config: pytest.Config) -> None:
    for name, function in {**BUDGET_MARKERS, "syncguard": syncguard_marker}.items():
        config.addinivalue_line("markers", marker_help(name, function))
    config.pluginmanager.register(SyncguardSession(config), "syncguard-session")


@pytest.fixture
def syncguard(request: pytest.FixtureRequest) -> SyncGuard:
    """Measured regions (``generation``, ``measure``), intended syncs (``allow``) and the last measurement."""
    return _guard_of(request.node)


def _guard_of(item: pytest.Item) -> SyncGuard:
    from .guard import SyncGuard

    guard = item.stash.get(_GUARD, None)
    if guard is None:
        options = item.stash.get(_OPTIONS, TestOptions())
        memory = any(b.signal == "memory" for b in item.stash.get(_BUDGETS, ()))
        guard = SyncGuard(item.nodeid, device=options.device, warmup=options.warmup, track_memory=memory)
        item.stash[_GUARD] = guard
    return guard


class SyncguardSession:
    """Per-run state: whether the summary is on, and the results gathered from every test's report."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        option = config.getoption("syncguard")
        self.enabled = bool(config.getini("syncguard") if option is None else option)
        json_path = config.getoption("syncguard_json")
        self.json_path = Path(json_path) if json_path else None
        artifacts = config.getoption("syncguard_artifacts")
        self.artifacts = Path(artifacts) if artifacts else None
        self.require_gpu = bool(config.getoption("syncguard_require_gpu"))
        self.is_worker = hasattr(config, "workerinput")
        self.results: dict[str, TestResult] = {}

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        try:
            item.stash[_BUDGETS] = budgets_for(item)
            item.stash[_OPTIONS] = options_for(item)
            return
        except BudgetError as exc:
            message = f"syncguard usage error: {exc}"
        pytest.fail(message, pytrace=False)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Generator[None, None, None]:
        budgets = item.stash.get(_BUDGETS, ())
        if not budgets and _GUARD not in item.stash:
            return (yield)
        from .capture import TestCapture
        from .guard import GenerationRegion, SyncMeasurement

        guard = _guard_of(item)
        options = item.stash.get(_OPTIONS, TestOptions())
        capture = TestCapture.for_signals({b.signal for b in budgets}, guard.default_device())
        whole_test = GenerationRegion(None, guard.default_device(), track_memory=capture.memory)
        raised = True
        try:
            with capture.recording(), whole_test.recording():
                outcome = yield
            raised = False
            return outcome
        finally:
            # The test's own regions, when it has any; else the whole call.
            chosen = guard.measurements or ([whole_test.measurement] if whole_test.measurement else [])
            result = None
            try:
                if chosen:
                    measurement = SyncMeasurement.combine(chosen)
                    error = None
                    try:
                        measurement = capture.with_timelines(measurement, options.warmup_steps)
                    except Exception as exc:  # a trace the analysis cannot read is reported, not swallowed
                        error = f"{item.nodeid}: GPU timeline analysis failed: {exc}"
                    result = _judge(item.nodeid, budgets, measurement, self.require_gpu, error)
                    if result.failed and capture.snapshots:
                        try:
                            result = replace(result, allocation_sites=capture.allocation_sites())
                        except Exception as exc:  # reported like an unreadable trace
                            result = replace(result, error=f"{item.nodeid}: allocator snapshot analysis failed: {exc}")
            finally:
                kept = capture.keep(self.artifacts, item.nodeid, raised or (result is not None and result.failed))
            if result is not None:
                item.stash[_RESULT] = replace(result, artifacts=kept)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(
        self, item: pytest.Item, call: pytest.CallInfo[None]
    ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
        report = yield
        result = item.stash.get(_RESULT, None)
        if call.when != "call" or result is None:
            return report
        from .report.terminal import failure_text

        setattr(report, REPORT_ATTRIBUTE, result.to_dict())
        if result.failed:
            text = failure_text(result)
            if report.passed:
                report.outcome = "failed"
                report.longrepr = text
            else:
                report.sections.append(("syncguard", text))
        return report

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        data = getattr(report, REPORT_ATTRIBUTE, None)
        if report.when == "call" and data is not None:
            from .report.results import TestResult

            self.results[report.nodeid] = TestResult.from_dict(data)

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if not self.enabled or self.is_worker:
            return
        from .report.terminal import summary_lines

        terminalreporter.write_sep("=", "syncguard summary")
        if not self.results:
            terminalreporter.write_line("no test was measured (none uses the syncguard fixture or a budget marker)")
            return
        for line in summary_lines(self.results.values()):
            terminalreporter.write_line(line)
        if self.json_path is not None:
            terminalreporter.write_line(f"syncguard results written to {self.json_path}")

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if self.json_path is None or self.is_worker:
            return
        from .report.json_file import write_results

        write_results(self.json_path, self.results.values())


def _judge(
    nodeid: str,
    budgets: tuple[SyncBudget, ...],
    measurement: SyncMeasurement,
    require_gpu: bool,
    error: str | None = None,
) -> TestResult:
    from .report.results import TestResult

    missing = [b for b in budgets if b.per_token and not measurement.tokens]
    if missing and error is None:
        error = (
            f"{nodeid}: @pytest.mark.{missing[0].marker} needs a token count: pass tokens= or model= to "
            "syncguard.generation() or syncguard.measure(), or set region.tokens inside the region"
        )
    judged = []
    for budget in budgets:
        if budget in missing:
            continue
        if budget.signal != "syncs" and not measurement.on_device:
            judged.append(budget.not_measured(f"needs CUDA; ran on {measurement.device}", required=require_gpu))
        elif budget.signal == "timeline" and not measurement.timelines:
            judged.append(budget.not_measured("no GPU timeline was recorded", required=require_gpu))
        else:
            judged.append(budget.judge(measurement))
    return TestResult.build(nodeid, measurement, judged, unjudged=missing, error=error)
