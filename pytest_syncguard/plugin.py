"""pytest hooks only: options, markers, the fixture, and attaching verdicts to the test's own report.

torch is imported lazily, when a test is measured, so that having the plugin installed costs nothing to
pytest runs that do not use it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Generator
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from .baselines import DEFAULT_TOLERANCE
from .budgets import (
    BUDGET_MARKERS,
    BudgetError,
    SyncBudget,
    TestOptions,
    budgets_for,
    marker_help,
    options_for,
    parse_tolerance,
)
from .budgets import syncguard as syncguard_marker

if TYPE_CHECKING:
    from .baselines import Baseline
    from .guard import SyncGuard, SyncMeasurement
    from .report.results import TestResult

_BUDGETS = pytest.StashKey["tuple[SyncBudget, ...]"]()
_OPTIONS = pytest.StashKey[TestOptions]()
_GUARD = pytest.StashKey["SyncGuard"]()
_RESULT = pytest.StashKey["TestResult"]()
#: What an xdist worker sends its controller about the baselines it wrote: {"written": {file: n}, "errors": [...]}.
_WORKER_BASELINES = "syncguard_baselines"
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
    group.addoption(
        "--syncguard-baselines",
        metavar="DIR",
        default=None,
        help="folder of the baseline files, one per device model (default: ini syncguard_baselines, else "
        "baselines/ under the rootdir)",
    )
    group.addoption(
        "--syncguard-update-baselines",
        action="store_true",
        default=False,
        help="write the measured metrics of the tests that ran into their device's baseline file (others kept)",
    )
    group.addoption(
        "--syncguard-tolerance",
        metavar="FRACTION",
        default=None,
        help=f"relative change of a noisy metric (gaps, busy, fragmentation, memory, time) reported as a regression "
        f"or improvement (default {DEFAULT_TOLERANCE}; counts are compared exactly)",
    )
    parser.addini("syncguard", type="bool", default=False, help="as --syncguard")
    parser.addini("syncguard_baselines", type="string", default="baselines", help="as --syncguard-baselines")


def pytest_configure(config: pytest.Config) -> None:
    for name, function in {**BUDGET_MARKERS, "syncguard": syncguard_marker}.items():
        config.addinivalue_line("markers", marker_help(name, function))
    config.pluginmanager.register(SyncguardSession(config), "syncguard-session")


def _baselines_dir(config: pytest.Config) -> Path:
    option = config.getoption("syncguard_baselines")
    if option:
        return Path(config.invocation_params.dir, str(option))
    base = config.inipath.parent if config.inipath is not None else config.rootpath
    return base / str(config.getini("syncguard_baselines"))


def _tolerance(config: pytest.Config) -> float:
    value = config.getoption("syncguard_tolerance")
    if value is None:
        return DEFAULT_TOLERANCE
    try:
        return parse_tolerance(value)
    except ValueError as exc:
        raise pytest.UsageError(f"--syncguard-tolerance {exc}") from None


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
        self.update_baselines = bool(config.getoption("syncguard_update_baselines"))
        if self.update_baselines and not self.enabled:
            raise pytest.UsageError("--syncguard-update-baselines needs --syncguard (or ini syncguard = true)")
        self.baselines_dir = _baselines_dir(config)
        self.tolerance = _tolerance(config)
        self.is_worker = hasattr(config, "workerinput")
        self.results: dict[str, TestResult] = {}
        self.notes: list[str] = []
        #: Baseline entries written per file, and the files that could not be written (this process's and,
        #: on the xdist controller, its workers').
        self.written: Counter[str] = Counter()
        self.baseline_errors: list[str] = []
        self._baselines: dict[Path, Baseline | None] = {}
        if self.enabled and self.is_worker:
            self._assign_gpu()

    def _assign_gpu(self) -> None:
        """Before any test initializes CUDA: worker gwN takes GPU N modulo the visible ones."""
        from .environment import assign_worker_gpu

        workerinput = getattr(self.config, "workerinput", {})
        _, warning = assign_worker_gpu(str(workerinput.get("workerid", "")), int(workerinput.get("workercount", 1)))
        if warning:
            self.notes.append(warning)

    def _compare(self, result: TestResult, options: TestOptions) -> TestResult:
        from .baselines import BaselineError, compare, path_for, read
        from .environment import fingerprint, slug_for

        slug = slug_for(result.device)
        path = path_for(self.baselines_dir, slug)
        try:
            if path not in self._baselines:
                self._baselines[path] = read(path)
        except BaselineError as exc:
            return replace(result, error=f"{result.nodeid}: {exc}")
        tolerance = self.tolerance if options.tolerance is None else options.tolerance
        environment = fingerprint(result.device)
        comparison = compare(
            self._baselines[path], slug, path, result.nodeid, result.metrics, result.samples, tolerance, environment
        )
        if self.update_baselines:
            comparison = replace(comparison, status="updated")
        return replace(
            result, baseline=comparison.to_dict(), notes=[*result.notes, *self.notes], fingerprint=environment
        )

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
                    if (fallback := _python_kernel_note()) is not None:
                        result = replace(result, notes=[*result.notes, fallback])
                    if self.enabled and options.baseline and result.error is None:
                        result = self._compare(result, options)
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
        if self.enabled:
            from .report.junit import properties

            # --junitxml writes the properties of the teardown report, which pytest builds from the item's.
            item.user_properties.extend(properties(result))
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
        from .report.terminal import baseline_lines, summary_lines

        terminalreporter.write_sep("=", "syncguard summary")
        if not self.results:
            terminalreporter.write_line("no test was measured (none uses the syncguard fixture or a budget marker)")
            return
        for line in summary_lines(self.results.values()):
            terminalreporter.write_line(line)
        for line in baseline_lines(self.results.values(), self.update_baselines, [*self.notes, *self._update_notes()]):
            terminalreporter.write_line(line)
        if self.json_path is not None:
            terminalreporter.write_line(f"syncguard results written to {self.json_path}")

    def _update_notes(self) -> list[str]:
        if not self.update_baselines:
            return []
        by = " by the xdist workers" if self.config.pluginmanager.has_plugin("dsession") else ""
        notes = [f"syncguard: wrote {n} baseline entries to {file}{by}" for file, n in sorted(self.written.items())]
        return notes + [f"syncguard: baselines NOT updated: {error}" for error in self.baseline_errors]

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: object) -> None:
        """On the xdist controller: take in what a finished worker wrote, and what it could not."""
        if error is not None and self.update_baselines:
            worker = getattr(getattr(node, "gateway", None), "id", "?")
            self.baseline_errors.append(f"xdist worker {worker} went down ({error}): its tests' entries are lost")
        sent = getattr(node, "workeroutput", {}).get(_WORKER_BASELINES)
        if not sent:
            return
        self.written.update(sent["written"])
        self.baseline_errors.extend(sent["errors"])

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        # Workers write their own tests' baselines (under the file's lock) and tell the controller; the
        # controller writes only what it ran itself.
        distributing = self.config.pluginmanager.has_plugin("dsession")
        if self.update_baselines and not distributing:
            self._write_baselines()
            if self.is_worker:
                output = {"written": dict(self.written), "errors": self.baseline_errors}
                self.config.workeroutput[_WORKER_BASELINES] = output  # type: ignore[attr-defined]
        if self.baseline_errors and not self.is_worker:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
        if self.json_path is None or self.is_worker:
            return
        from .report.json_file import write_results

        write_results(self.json_path, self.results.values())

    def _write_baselines(self) -> None:
        from .baselines import BaselineError, update
        from .environment import fingerprint

        by_file: dict[tuple[str, str, str], dict[str, dict[str, float]]] = {}
        for result in self.results.values():
            if result.baseline is not None and result.error is None:
                key = (result.baseline["file"], result.baseline["device"], result.device)
                by_file.setdefault(key, {})[result.nodeid] = result.metrics
        for (file, slug, device), entries in sorted(by_file.items()):
            try:
                self.written[file] += update(Path(file), slug, entries, fingerprint(device))
            except BaselineError as exc:
                self.baseline_errors.append(str(exc))


def _python_kernel_note() -> str | None:
    """Why scalar reads were counted by the slower Python kernel, unless the user switched the native one off."""
    from .probes.native import NATIVE

    why = NATIVE.unavailable
    if why is None or why.startswith("switched off"):
        return None
    return f"syncguard: scalar reads were counted by the Python kernel (same counts, slower): the native kernel {why}"


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
