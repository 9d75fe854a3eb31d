"""The pytest hooks: options, markers, the fixture, a test's measurement wired around its call (the diagnostic
reruns of a failing test, one GPU per xdist worker, where kept timelines go), and its verdicts attached to the
test's own report.

torch is imported lazily, when a test is measured, so that having the plugin installed costs nothing to
pytest runs that do not use it.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from collections.abc import Callable, Generator
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from . import ranks
from .ab_channel import WORKER_OPTION, Channel
from .budgets import (
    BudgetError,
    GuardOptions,
    budgets_for,
    marker_lines,
    options_for,
)
from .document.budget import Budget
from .document.comparison import NOT_UPDATED
from .document.shard import Shard, parsed
from .files import file_problem, folder_problem
from .judge.baselines import BaselineStore
from .judge.comparison import DEFAULT_TOLERANCE
from .metrics import parse_tolerance
from .render.perfetto import TimelineFiles
from .rootdir import space_form_problem
from .signals import KINDS, needs
from .timeline_source import AUTO, REQUESTS, SAMPLED, SamplerUnavailable, TimelineSource, choose

if TYPE_CHECKING:
    from .document.launch import Launch
    from .document.measured import MeasuredTest
    from .guard import SyncGuard

_BUDGETS = pytest.StashKey[tuple[Budget, ...]]()
_OPTIONS = pytest.StashKey[GuardOptions]()
_GUARD = pytest.StashKey["SyncGuard"]()
_RESULT = pytest.StashKey["MeasuredTest"]()
#: On an xdist worker's call report: the test's results document record (results_file.record), for the controller.
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
        help="keep the GPU trace (Chrome/Perfetto JSON, gzipped), judged timelines and allocator snapshot of each "
        "failing test in DIR",
    )
    group.addoption(
        "--syncguard-require-gpu",
        action="store_true",
        default=False,
        help="a budget that needs CUDA (GPU timeline, allocator) fails on a run without it, instead of being "
        "reported as not measured (a test none of whose budgets was measured is then skipped, with the reason)",
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
        help="relative change of a noisy metric against its baseline reported as a regression or improvement "
        "(default: each device-side metric's own, from its spread between runners; host timings "
        f"{DEFAULT_TOLERANCE}; counts are compared exactly)",
    )
    group.addoption(
        "--syncguard-judge-host-timings",
        action="store_true",
        default=None,
        help="judge host-dependent timings (time, tokens/s, gaps, busy fraction) against the baselines too: only "
        "where this runner recorded them (by default they are shown, and judged A/B with `syncguard ab`)",
    )
    group.addoption(
        "--syncguard-gap-ops",
        action="store_true",
        default=None,
        help="a test that fails a GPU timeline budget runs its call once more with every host operator recorded, "
        "and its failure lists the operators between launches in that run's largest gaps (not judged: recording "
        "them slows the host)",
    )
    group.addoption(
        "--syncguard-timeline",
        choices=REQUESTS,
        default=None,
        help="how a GPU timeline is recorded: 'auto' (default: sampled where this process can read the GPU's "
        "counters, else the trace, and the summary says why), 'sampled' (CUPTI's PM sampler over each timed run, "
        "which adds nothing to a launch; a usage error where it cannot run) or 'trace' (the test's call captured "
        "with CUPTI's kernel records, which slow each launch)",
    )
    group.addoption(
        "--syncguard-keep-timelines",
        action="store_true",
        default=None,
        help="keep the judged GPU timeline of every test as a Perfetto file (by default only a test that broke a "
        "GPU timeline budget keeps one), in --syncguard-artifacts or else under pytest's temporary directory",
    )
    group.addoption(
        "--syncguard-timings-only",
        action="store_true",
        default=False,
        help="measure each test's timings only: no operator counting, no count, race or diagnostic check, only the "
        "timeline and memory budgets (whose metrics vary from run to run); what syncguard ab's rounds after the "
        "first run (the first one counts)",
    )
    group.addoption(
        "--syncguard-shard",
        metavar="K/N",
        default=None,
        help="this run is shard K of a suite split into N CI jobs (default: SYNCGUARD_SHARD): its results file says "
        "so, and syncguard report, given every job's files, fails the run naming a shard that left none",
    )
    group.addoption(
        "--syncguard-repeat",
        metavar="N",
        default=None,
        help="each syncguard.measure() makes its traced run (whose trace gives the device time) and then N timed "
        "runs (N >= 0), whatever repeat it asks for: what syncguard ab --timed-runs gives its rounds after the first",
    )
    group.addoption(
        WORKER_OPTION,
        metavar="READ,WRITE",
        default=None,
        help="internal, for syncguard ab: run the selected tests once per turn that file descriptor READ asks for, "
        "and answer on WRITE",
    )
    parser.addini("syncguard", type="bool", default=False, help="as --syncguard")
    parser.addini("syncguard_timeline", type="string", default=AUTO, help="as --syncguard-timeline")
    parser.addini("syncguard_gap_ops", type="bool", default=False, help="as --syncguard-gap-ops")
    parser.addini("syncguard_baselines", type="string", default="baselines", help="as --syncguard-baselines")
    parser.addini("syncguard_judge_host_timings", type="bool", default=False, help="as --syncguard-judge-host-timings")
    parser.addini("syncguard_keep_timelines", type="bool", default=False, help="as --syncguard-keep-timelines")


@pytest.hookimpl(tryfirst=True)  # before junitxml's, which opens the file its option names
def pytest_configure(config: pytest.Config) -> None:
    for line in marker_lines():
        config.addinivalue_line("markers", line)
    try:
        rank = ranks.current()
    except ValueError as exc:
        raise pytest.UsageError(f"syncguard: {exc}") from None
    if rank is not None and config.option.xmlpath:  # one rank's JUnit file must not overwrite another's
        config.option.xmlpath = rank.path(str(config.option.xmlpath))
    session = SyncguardSession(config)
    config.pluginmanager.register(session, "syncguard-session")
    worker = config.getoption("syncguard_ab_worker")
    if worker:
        from .ab_worker import ABWorker

        try:
            channel = Channel.of_option(str(worker))
        except ValueError as exc:
            raise pytest.UsageError(str(exc)) from None
        config.pluginmanager.register(ABWorker(config, channel, session), "syncguard-ab-worker")


def _baselines_dir(config: pytest.Config) -> Path:
    option = config.getoption("syncguard_baselines")
    if option:
        return Path(config.invocation_params.dir, str(option))
    base = config.inipath.parent if config.inipath is not None else config.rootpath
    return base / str(config.getini("syncguard_baselines"))


def _checked(value: object, option: str, problem: Callable[[Path], str | None]) -> Path | None:
    """The path an option names, checked before any test runs (a problem is a usage error naming the option)."""
    if not value:
        return None
    path = Path(str(value))
    found = problem(path)
    if found is not None:
        raise pytest.UsageError(f"{option} {value}: {found}")
    return path


def _not_an_input(config: pytest.Config, results: Path) -> None:
    """A usage error where the results file would overwrite the JUnit file or a baseline file."""
    target = results.resolve()
    junit = config.option.xmlpath
    if junit and Path(str(junit)).resolve() == target:
        raise pytest.UsageError(f"--syncguard-json {results} and --junitxml {junit} name one file: give two")
    baselines = _baselines_dir(config).resolve()
    if target.parent == baselines:
        raise pytest.UsageError(
            f"--syncguard-json {results} is in the baselines folder {baselines}, where it would "
            "replace a GPU model's baselines: write it elsewhere"
        )


def _timeline_source(config: pytest.Config) -> str:
    option = config.getoption("syncguard_timeline")
    if option is not None:
        return str(option)
    value = str(config.getini("syncguard_timeline")).strip()
    if value not in REQUESTS:
        raise pytest.UsageError(f"ini syncguard_timeline = {value!r}: must be one of {', '.join(REQUESTS)}")
    return value


def _repeat(config: pytest.Config) -> int | None:
    value = config.getoption("syncguard_repeat")
    if value is None:
        return None
    if not (str(value).isascii() and str(value).isdigit()):
        raise pytest.UsageError(f"--syncguard-repeat {value}: not a number of timed runs (0 or more)")
    return int(value)


def _tolerance(config: pytest.Config) -> float | None:
    value = config.getoption("syncguard_tolerance")
    if value is None:
        return None
    try:
        return parse_tolerance(value)
    except ValueError as exc:
        raise pytest.UsageError(f"--syncguard-tolerance {exc}") from None


@pytest.fixture
def syncguard(request: pytest.FixtureRequest) -> SyncGuard:
    """Measured regions (``generation``, ``measure``), intended syncs (``allow``) and the last measurement."""
    return _guard_of(request.node)


def _settle_allocator() -> None:
    """A measured test starts from an allocator that holds only live tensors' memory, whatever ran before it
    (:func:`.probes.memory.settle_allocator`); a process without torch has nothing to settle."""
    if "torch" in sys.modules:
        from .probes.memory import settle_allocator

        settle_allocator()


def _guard_of(item: pytest.Item) -> SyncGuard:
    from .guard import SyncGuard

    guard = item.stash.get(_GUARD, None)
    if guard is None:
        options = item.stash.get(_OPTIONS, GuardOptions())
        needed = needs(b.kind.signal for b in item.stash.get(_BUDGETS, ()))
        guard = SyncGuard(item.nodeid, device=options.device, warmup=options.warmup, needs=needed)
        item.stash[_GUARD] = guard
    return guard


def _with_gap_diagnosis(item: pytest.Item, guard: SyncGuard, result: MeasuredTest) -> MeasuredTest:
    """The result with a diagnostic rerun's gaps (``--syncguard-gap-ops``), or a note of why there are none."""
    from .capture import diagnose_gaps

    try:
        diagnosis = diagnose_gaps(item.nodeid, guard, item.stash.get(_OPTIONS, GuardOptions()), item.runtest)
    except Exception as exc:  # the judged result stands; the note says why there is no diagnosis
        note = f"syncguard: {item.nodeid}: --syncguard-gap-ops: no diagnosis: {type(exc).__name__}: {exc}"
        return replace(result, notes=(*result.notes, note))
    return replace(result, gap_diagnosis=diagnosis)


def _with_allocation_sites(
    item: pytest.Item, guard: SyncGuard, result: MeasuredTest, artifacts: Path | None
) -> MeasuredTest:
    """The result with the allocation sites of a diagnostic rerun, or a note of why there are none."""
    from .capture import diagnose_allocations

    options = item.stash.get(_OPTIONS, GuardOptions())
    try:
        sites, kept, problem = diagnose_allocations(item.nodeid, guard, options, item.runtest, artifacts)
    except Exception as exc:  # the judged result stands; the note says why there are no sites
        note = (
            f"syncguard: {item.nodeid}: no allocation sites: the diagnostic rerun failed: {type(exc).__name__}: {exc}"
        )
        return replace(result, notes=(*result.notes, note))
    notes = (*result.notes, *([problem] if problem else []))
    return replace(result, allocation_sites=sites, artifacts=(*result.artifacts, *kept), notes=notes)


def _syncs_not_measured(result: MeasuredTest, blind: str) -> MeasuredTest:
    """A test that started processes whose syncs cannot be counted (not Python): its sync budgets that held are not
    measured, saying which processes, rather than passing on their silence (one that broke stays broken)."""
    why = f"not measured: {blind}, started by this test, is not a Python process: its syncs cannot be counted"
    checks = tuple(
        replace(c, held=None, text=why) if c.held and KINDS[c.budget.marker].signal == "syncs" else c
        for c in result.checks
    )
    return replace(result, checks=checks)


def _shard_of(config: pytest.Config) -> Shard | None:
    """The shard of a split suite this run is (``--syncguard-shard``, else ``SYNCGUARD_SHARD``); a usage error naming
    where a value that is none came from."""
    option, variable = config.getoption("syncguard_shard"), os.environ.get("SYNCGUARD_SHARD", "").strip()
    text, named = (option, "--syncguard-shard") if option is not None else (variable, "SYNCGUARD_SHARD")
    if not text:
        return None
    try:
        return parsed(text)
    except ValueError as exc:
        raise pytest.UsageError(f"{named} {exc}") from None


def _misuse_line(excinfo: pytest.ExceptionInfo[BaseException]) -> str:
    """A misuse of the fixture as ``file:line: message``, the line the test's own code where it happened (the
    innermost frame outside the plugin and contextlib), without the traceback through them."""
    here = str(Path(__file__).parent)
    frames = [e for e in excinfo.traceback if not str(e.path).startswith(here) and "contextlib" not in str(e.path)]
    where = f"{os.path.relpath(frames[-1].path)}:{frames[-1].lineno + 1}: " if frames else ""
    return f"{where}{excinfo.value}"


def _expected_failure(item: pytest.Item, report: pytest.TestReport) -> str | None:
    """The reason of an xfail mark that a failed budget satisfies, where the test's body did not fail (pytest read
    it as XPASS, or a strict mark as a failure): None where no such mark applies (or it expects an exception)."""
    mark = item.get_closest_marker("xfail")
    if mark is None or mark.kwargs.get("raises") is not None or item.config.option.runxfail:
        return None
    if not (mark.args[0] if mark.args else mark.kwargs.get("condition", True)):
        return None
    xpassed = report.passed and hasattr(report, "wasxfail")
    strict = report.failed and str(report.longrepr).startswith("[XPASS(strict)]")
    if not (xpassed or strict):
        return None
    reason = str(mark.kwargs.get("reason", ""))
    return f"syncguard budget failed{': ' + reason if reason else ''}"


class SyncguardSession:
    """Per-run state: whether the summary is on, the baseline store, and the results of every test's report."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        if (spaced := space_form_problem(config)) is not None:
            raise pytest.UsageError(spaced)
        option = config.getoption("syncguard")
        self.enabled = bool(config.getini("syncguard") if option is None else option)
        self.rank = rank = ranks.current()  # checked in pytest_configure
        json_option = config.getoption("syncguard_json")
        if rank is not None and json_option:
            json_option = rank.path(str(json_option))
        self.json_path = _checked(json_option, "--syncguard-json", file_problem)
        if self.json_path is not None:
            _not_an_input(config, self.json_path)
        self.artifacts = _checked(config.getoption("syncguard_artifacts"), "--syncguard-artifacts", folder_problem)
        self.shard = _shard_of(config)
        self.require_gpu = bool(config.getoption("syncguard_require_gpu"))
        updating = bool(config.getoption("syncguard_update_baselines"))
        if updating and not self.enabled:
            raise pytest.UsageError("--syncguard-update-baselines needs --syncguard (or ini syncguard = true)")
        if updating and rank is not None:
            raise pytest.UsageError(
                f"--syncguard-update-baselines: this process is {rank.describe()}: every rank would write its own "
                "numbers into one baseline file; record the launch's joined results instead: syncguard baselines "
                "DIR --record RESULTS.rank*.json"
            )
        baselines = _baselines_dir(config)
        if updating and (problem := folder_problem(baselines)) is not None:
            raise pytest.UsageError(f"--syncguard-baselines (with --syncguard-update-baselines): {problem}")
        judge = config.getoption("syncguard_judge_host_timings")
        host_timings = bool(config.getini("syncguard_judge_host_timings") if judge is None else judge)
        self.store = BaselineStore(baselines, _tolerance(config), updating=updating, host_timings=host_timings)
        self.timeline_request = _timeline_source(config)
        self.timings_only = bool(config.getoption("syncguard_timings_only"))
        """Measure timed runs only (--syncguard-timings-only; syncguard ab's warm side sets it per turn)."""
        self.repeat = _repeat(config)
        """Timed runs of each measure() after its traced run (--syncguard-repeat; per turn, as above)."""
        self._timeline_source: TimelineSource | None = None
        gap_ops = config.getoption("syncguard_gap_ops")
        self.gap_ops = bool(config.getini("syncguard_gap_ops") if gap_ops is None else gap_ops)
        keep = config.getoption("syncguard_keep_timelines")
        self.timeline_files = TimelineFiles(
            self._timeline_dir, every=bool(config.getini("syncguard_keep_timelines") if keep is None else keep)
        )
        self.sampler_obstacle: str | None = None
        """Why this process's GPU cannot be sampled before the sampler is tried (xdist workers share it)."""
        self.is_worker = hasattr(config, "workerinput")
        self.results: dict[str, MeasuredTest] = {}
        self.notes: list[str] = [f"syncguard: measured by {rank.describe()}"] if rank is not None else []
        self.interrupted = False
        self.json_written = False
        self._ran_on: dict[str, int] = {}
        """On the xdist controller: which worker (its node object's identity) measured each test."""
        self._restore_threads: Callable[[], None] | None = None
        self._restore_stop: Callable[[], None] | None = None
        """Puts SIGTERM back as it was (a rank's stop stack, :func:`.ranks.record_stop`)."""
        from .probes.children import Folder

        self.children = Folder()
        """The folder the measured tests' child processes write their syncs to."""
        self._restore_timing: Callable[[], None] | None = None
        """Puts the NCCL timing variables back (:func:`.environment.collective_timing`)."""
        if self.enabled and self.is_worker:
            self._assign_gpu()
        if self.enabled:  # before any test makes a process group
            from .environment import collective_timing

            self._restore_timing = collective_timing()
        self._restore_census: Callable[[], None] | None = None
        """Stops the graph census reading captures (:mod:`.probes.graph_nodes`)."""
        self._measured_once = False
        """This process has begun measuring (:meth:`_begin_measuring`, at its first measured test)."""

    def _timeline_dir(self) -> Path:
        """Where judged timelines are written: --syncguard-artifacts, else pytest's temporary directory of the run
        (kept for the last three runs, as ``tmp_path``'s)."""
        if self.artifacts is not None:
            return self.artifacts
        factory = getattr(self.config, "_tmp_path_factory", None)  # what the tmp_path fixtures use
        if factory is None:
            return Path(tempfile.gettempdir()) / "syncguard-timelines"
        return Path(factory.getbasetemp()) / "syncguard-timelines"

    def _assign_gpu(self) -> None:
        """Before any test initializes CUDA: worker gwN takes GPU N modulo the visible ones. Where workers share a
        GPU, its PM sampler (one process at a time) cannot serve them: their timelines come from the trace."""
        from .environment import assign_worker_gpu, visible_gpus

        workerinput = getattr(self.config, "workerinput", {})
        workers, gpus = int(workerinput.get("workercount", 1)), len(visible_gpus())
        _, warning = assign_worker_gpu(str(workerinput.get("workerid", "")), workers)
        if warning:
            self.notes.append(warning)
        if 0 < gpus < workers:
            self.sampler_obstacle = (
                f"{workers} xdist workers share {gpus} GPU(s), and a GPU's PM sampler serves one process at a time"
            )

    def _begin_measuring(self) -> None:
        """At this process's first measured test, before its fixtures: an xdist worker takes its share of the cores;
        where there is a CUDA driver, the graph census reads every capture from now on (the sampled timeline tells
        the gaps a graph's memsets and copies leave by it)."""
        from .environment import has_cuda_driver

        if self.is_worker:
            self._share_cores()
        if has_cuda_driver():
            from .probes.graph_nodes import CENSUS

            self._restore_census = CENSUS.watch()

    def _share_cores(self) -> None:
        """Torch's threads for this worker: its share of the cores (environment.share_cores), restored at the end.
        Only a worker that measures does it: a project that runs no measured test keeps torch as it is."""
        from .environment import share_cores

        workerinput = getattr(self.config, "workerinput", {})
        shared = share_cores(str(workerinput.get("workerid", "")), int(workerinput.get("workercount", 1)))
        if shared is not None:
            self._restore_threads, note = shared
            self.notes.append(note)

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        self.children.remove()
        for name in ("_restore_threads", "_restore_stop", "_restore_timing", "_restore_census"):
            restore = getattr(self, name)
            setattr(self, name, None)
            if restore is not None:
                restore()

    def timeline_source(self) -> TimelineSource:
        """The source of this process's GPU timelines, chosen when a test first needs one (the sampler is tried
        then, on the device the test runs on)."""
        if self._timeline_source is None:
            from .probes.sampler import SAMPLER

            obstacle = self.sampler_obstacle
            try:
                self._timeline_source = choose(self.timeline_request, lambda: obstacle or SAMPLER.unavailable())
            except SamplerUnavailable as exc:
                raise pytest.UsageError(str(exc)) from None
        return self._timeline_source

    def pytest_sessionstart(self, session: pytest.Session) -> None:
        """A forced sampled timeline where the sampler cannot run is a usage error before any test runs. A rank of a
        launch says where it was if its launcher stops it (:func:`.ranks.record_stop`)."""
        if self.timeline_request == SAMPLED and not self.distributing:
            self.timeline_source()
        if self.rank is not None and self.json_path is not None and not self.is_worker:
            try:
                self._restore_stop = ranks.record_stop(self.json_path)
            except OSError as exc:
                self.notes.append(f"syncguard: this rank cannot say where it was if stopped: {exc}")

    @property
    def distributing(self) -> bool:
        """This is the xdist controller: its workers run the tests."""
        return bool(self.config.pluginmanager.has_plugin("dsession"))

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        # A test run again (syncguard ab's warm sides, a rerun) starts afresh.
        if _GUARD in item.stash:
            del item.stash[_GUARD]
        if _RESULT in item.stash:
            del item.stash[_RESULT]
        try:
            item.stash[_BUDGETS] = budgets_for(item)
            item.stash[_OPTIONS] = options_for(item)
        except BudgetError as exc:
            message = f"syncguard usage error: {exc}"
        else:
            if item.stash[_BUDGETS] or "syncguard" in getattr(item, "fixturenames", ()):
                if not self._measured_once:  # at this process's first measured test, not before
                    self._measured_once = True
                    self._begin_measuring()
                _settle_allocator()  # the fixtures it creates go among live tensors, not into what others cached
            return
        pytest.fail(message, pytrace=False)  # outside the handler: no "During handling" chain in the report

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, None, Any]:
        """A measured test's Python child processes, from its setup to its teardown, measure their syncs
        (:mod:`.probes.children`)."""
        marked = any(item.get_closest_marker(kind) is not None for kind in KINDS)
        if not (marked or "syncguard" in getattr(item, "fixturenames", ())):
            return (yield)
        from .probes.children import measuring

        with measuring(self.children.path):
            return (yield)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Generator[None, None, None]:
        try:
            # Again: a fixture may have added a budget marker (request.node.add_marker) after setup read them.
            budgets = item.stash[_BUDGETS] = budgets_for(item)
        except BudgetError as exc:
            pytest.fail(f"syncguard usage error: {exc}", pytrace=False)
        if not budgets and _GUARD not in item.stash:
            return (yield)
        from .capture import CallCapture

        _settle_allocator()  # what the fixtures' setup cached goes back too
        guard = _guard_of(item)
        declared = budgets
        if self.timings_only:  # the counts were judged in a run of their own (syncguard ab's first round)
            untimed = self.repeat == 0  # the traced run alone: no timed run has a timeline to judge
            budgets = tuple(b for b in budgets if b.signal.timed and not (untimed and b.signal.name == "timeline"))
        guard.timings_only, guard.repeat = self.timings_only, self.repeat
        options = item.stash.get(_OPTIONS, GuardOptions())
        capture = CallCapture.of(
            item.nodeid,
            guard,
            budgets,
            options,
            default_checks=self.enabled and not self.timings_only,
            source=self.timeline_source,
        )
        guard.needs = capture.needs  # asked once: every region of the test records what its budgets need
        raised: BaseException | None = None
        from .probes.children import Child, read
        from .probes.spawned import Started, not_measured, note, watching

        started: list[Started] = []
        children: list[Child] = []
        began = time.time_ns()
        try:
            with capture.recording(), watching() as started:
                try:
                    outcome = yield
                except BaseException as exc:
                    raised = exc
                    raise
                finally:
                    children = read(self.children.path)
            capture.misuse = capture.misuse or guard.misuse  # a misuse the test may not have seen (another thread)
            if set(budgets_for(item)) != set(declared):
                capture.misuse = capture.misuse or (
                    "a budget marker was added during the test's call, after its measurement began: add it with "
                    "a decorator, or from a fixture (request.node.add_marker)"
                )
            return outcome
        finally:
            result = capture.result(
                raised=raised,
                require_gpu=self.require_gpu,
                store=self.store if self.enabled else None,
                artifacts=self.artifacts,
                notes=self.notes,
                timelines=self.timeline_files,
            )
            if result is not None and raised is None and self.gap_ops and result.broke("timeline"):
                result = _with_gap_diagnosis(item, guard, result)
            if result is not None and raised is None and result.broke("memory"):
                result = _with_allocation_sites(item, guard, result, self.artifacts)
            ended = time.time_ns()
            read(self.children.path, since_ns=ended)  # what the test's children did is judged: forgotten
            if result is not None and (spawned := note(started, children, (began, ended))) is not None:
                result = replace(result, notes=(*result.notes, spawned))
            if result is not None and (blind := not_measured(started, children)) is not None:
                result = _syncs_not_measured(result, blind)
            if result is not None:
                item.stash[_RESULT] = result

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(
        self, item: pytest.Item, call: pytest.CallInfo[None]
    ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
        report = yield
        guard = sys.modules.get(f"{__package__}.guard")  # not loaded: no fixture was used, nothing misused
        misused = (
            call.excinfo is not None
            and guard is not None
            and report.failed
            and isinstance(call.excinfo.value, guard.SyncguardUsageError)
        )
        if misused:
            assert call.excinfo is not None
            report.longrepr = _misuse_line(call.excinfo)  # one clean line, as a bad marker gives
        result = item.stash.get(_RESULT, None)
        if call.when != "call" or result is None:
            return report
        from .render.terminal import failure_text

        expected = _expected_failure(item, report) if result.failed and not misused else None
        if expected is not None:
            result = replace(result, expected_failure=expected)
        self.results[item.nodeid] = result
        if self.is_worker:
            from .document.file import record

            setattr(report, REPORT_ATTRIBUTE, record(result))
        if self.enabled:
            from .judge.junit import PREFIX
            from .render.junit import properties

            # --junitxml writes the properties of the teardown report, which pytest builds from the item's; a test
            # run again has only its last run's.
            item.user_properties[:] = [p for p in item.user_properties if not str(p[0]).startswith(PREFIX)]
            item.user_properties.extend(properties(result))
        if misused:  # the misuse is the failure: what the budgets made of a region it cut short is no news
            return report
        if result.failed:
            text = failure_text(result)
            if expected is not None:  # the budget is the failure an xfail mark expects: XFAIL, with its text
                report.outcome, report.wasxfail = "skipped", expected
                report.longrepr = None
                report.sections.append(("syncguard", text))
            elif report.passed:
                report.outcome = "failed"
                report.longrepr = text
            else:
                report.sections.append(("syncguard", text))
        elif report.passed and (unmeasured := [c for c in result.checks if c.held is None]):
            # A budget that could not be measured did not pass: a test none of whose budgets was measured is
            # skipped with the reason; one with some says which in its report.
            reasons = "; ".join(c.text for c in unmeasured)
            if len(unmeasured) == len(result.checks):
                path, line, _ = item.location
                report.outcome = "skipped"
                report.longrepr = (
                    path,
                    (line or 0) + 1,
                    f"syncguard: no budget measured on {result.device}: {reasons}",
                )
            else:
                report.sections.append(("syncguard", f"not measured on {result.device}: {reasons}"))
        return report

    def again(self, item: pytest.Item) -> None:
        """Ready ``item`` for another call with its fixtures still set up (syncguard ab's later rounds): its last
        result forgotten, its ``syncguard`` fixture warm (:meth:`.guard.SyncGuard.again`)."""
        self.results.pop(item.nodeid, None)
        if _RESULT in item.stash:
            del item.stash[_RESULT]
        guard = item.stash.get(_GUARD, None)
        if guard is not None:
            guard.again()

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """On the xdist controller: the results its workers measured."""
        data = getattr(report, REPORT_ATTRIBUTE, None)
        if report.when == "call" and data is not None and not self.is_worker:
            from .document.file import from_record

            self.results[report.nodeid] = from_record(data)
            self._ran_on[report.nodeid] = id(getattr(report, "node", None))

    def pytest_runtest_logstart(self, nodeid: str) -> None:
        self._write_as_rank(in_flight=nodeid)

    def pytest_runtest_logfinish(self, nodeid: str) -> None:
        self._write_as_rank(in_flight=None)

    def _write_as_rank(self, in_flight: str | None) -> None:
        """In a launch of several processes, this rank's results as they stand, with the test in flight: a rank that
        dies leaves what it finished and the test it died in (:func:`.document.launch.join` names it)."""
        launch = self._launch(finished=False, in_flight=in_flight)
        if launch is None or self.json_path is None or self.is_worker:
            return
        import torch

        from .document import file as results_file

        try:
            results_file.write(self.json_path, self.results.values(), torch.__version__, launch, self.shard)
        except (OSError, ValueError) as exc:
            self.notes.append(f"syncguard: this rank's results NOT written to {self.json_path} as it went: {exc}")

    def _launch(self, *, finished: bool, in_flight: str | None = None) -> Launch | None:
        """What this rank's results document says of it (None: this process is no rank of a launch), with the slug of
        its GPU (its CPU's without one) for a test no rank finished."""
        if self.rank is None:
            return None
        import torch

        from .document.launch import Launch
        from .environment import slug_for

        slug = slug_for("cuda" if torch.cuda.is_available() else "cpu")
        return Launch(self.rank.rank, self.rank.world_size, finished, in_flight, slug, ranks.launch_id())

    def pytest_keyboard_interrupt(self, excinfo: pytest.ExceptionInfo[BaseException]) -> None:
        self.interrupted = True

    @pytest.hookimpl(trylast=True)
    def pytest_runtest_teardown(self, item: pytest.Item) -> None:
        """Nothing a test left open reaches the next one, whether syncguard measured the test or not."""
        probes = sys.modules.get("pytest_syncguard.probes.syncs")
        if probes is not None and any(probes.PROBE.left_open()):
            probes.PROBE.reset()

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if not self.enabled or self.is_worker:
            return
        from .render.terminal import baseline_lines, summary_lines

        terminalreporter.write_sep("=", "syncguard summary")
        if self.interrupted:
            finished = f"{len(self.results)} measured test(s) finished" if self.results else "no measured test finished"
            terminalreporter.write_line(f"the run was interrupted (KeyboardInterrupt): {finished} before it")
        if not self.results:
            if not self.interrupted:
                terminalreporter.write_line("no test was measured (none uses the syncguard fixture or a budget marker)")
            return
        for line in summary_lines(self.results.values()):
            terminalreporter.write_line(line)
        notes = [*self.notes, *self.store.notes(by_workers=self.distributing)]
        for line in baseline_lines(self.results.values(), self.store.updating, notes):
            terminalreporter.write_line(line)
        if self.json_written:
            terminalreporter.write_line(f"syncguard results written to {self.json_path}")

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: object) -> None:
        """On the xdist controller: take in what a finished worker wrote, and what it could not."""
        if error is not None and self.store.updating:
            self.store.worker_lost(getattr(getattr(node, "gateway", None), "id", "?"), error)
            # A worker writes its tests' entries as it finishes: those of one that went down were never written.
            self._not_updated(lambda nodeid, file: self._ran_on.get(nodeid) == id(node))
        sent = getattr(node, "workeroutput", {}).get(BaselineStore.WORKER_KEY)
        if sent:
            self.store.add_worker_output(sent)
            self._unwritten_rows()

    def _unwritten_rows(self) -> None:
        """The tests whose baseline file an update could not write read "NOT updated", not "updated"."""
        self._not_updated(lambda nodeid, file: file in self.store.unwritten)

    def _not_updated(self, unwritten: Callable[[str, str], bool]) -> None:
        """Each test read "updated" whose entry was not written (``unwritten`` of its node id and baseline file)
        reads "NOT updated"."""
        for nodeid, result in list(self.results.items()):
            compared = result.comparison
            if compared is not None and compared.status == "updated" and unwritten(nodeid, compared.file):
                self.results[nodeid] = replace(result, comparison=replace(compared, status=NOT_UPDATED))

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        # Workers write their own tests' baselines (under the file's lock) and tell the controller; the
        # controller writes only what it ran itself.
        if self.store.updating and not self.distributing:
            try:
                self.store.write(self.results.values())
            except KeyboardInterrupt:  # Ctrl-C while another run holds the lock: say so, and finish the rest
                self.interrupted = True
                self.store.errors.append(
                    "interrupted (KeyboardInterrupt) while writing or waiting for the baseline file's lock: "
                    "nothing more was written; what each file holds is whole (each is replaced at once)"
                )
                session.exitstatus = pytest.ExitCode.INTERRUPTED
            self._unwritten_rows()
            if self.is_worker:
                self.config.workeroutput[BaselineStore.WORKER_KEY] = self.store.worker_output()  # type: ignore[attr-defined]
        if self.json_path is not None and not self.is_worker:
            import torch

            from .document import file as results_file

            launch = self._launch(finished=True)
            try:
                results_file.write(self.json_path, self.results.values(), torch.__version__, launch, self.shard)
                self.json_written = True
            except (OSError, ValueError) as exc:
                self.notes.append(f"syncguard: results NOT written to {self.json_path}: {exc}")
        failed = self.store.errors or (self.json_path and not self.json_written)
        if failed and not self.is_worker and session.exitstatus != pytest.ExitCode.INTERRUPTED:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
