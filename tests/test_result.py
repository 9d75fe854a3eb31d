"""One typed result from measurement to report: the region object after its block, the xdist/JSON round trip,
one value per number in every rendering, the CLI without torch, and the names pytest must not collect."""

from __future__ import annotations

import importlib
import inspect
import json
import os
import pkgutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

import pytest_syncguard
from pytest_syncguard import SyncGuard, SyncguardUsageError
from pytest_syncguard.analysis import gaps, trace_file
from pytest_syncguard.analysis.counts import RegionCounts
from pytest_syncguard.budgets import check_budgets
from pytest_syncguard.document.budget import Budget
from pytest_syncguard.document.file import from_record, record
from pytest_syncguard.document.measured import MeasuredTest
from pytest_syncguard.judge.comparison import compare
from pytest_syncguard.judge.junit import read_cases
from pytest_syncguard.measurement import Measurement
from pytest_syncguard.metrics import Metrics, metric
from pytest_syncguard.probes.sampler import SAMPLER
from pytest_syncguard.render.terminal import failure_text, summary_lines
from pytest_syncguard.result import measured_test
from pytest_syncguard.signals import KINDS
from pytest_syncguard.timeline_source import AUTO, SAMPLED, TRACE, SamplerUnavailable, choose

DATA = Path(__file__).parent / "data"


class Stepper(torch.nn.Module):
    """A decode step that reads the device once per call, like a stop check."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x * self.weight
        if y.sum() > 1e9:  # one scalar read
            y = y * 0
        return y


def test_region_holds_its_measurement_after_the_block() -> None:
    model = Stepper()
    with torch.no_grad(), SyncGuard("t").generation(model=model) as region:
        x = torch.ones(4)
        for _ in range(5):
            x = model(x)
        with pytest.raises(SyncguardUsageError, match="after its `with` block"):
            _ = region.syncs
        x.sum().item()  # one more, outside the model
    assert region.tokens == 5  # counted from model=
    assert region.syncs == 6
    assert region.syncs_per_token == pytest.approx(6 / 5)
    assert region.by_kind() == {"scalar read": 6}
    (first, second) = region.sites()
    assert (first.count, first.site and first.site.function) == (5, "Stepper.forward")
    assert (second.count, second.site and second.site.function) == (
        1,
        "test_region_holds_its_measurement_after_the_block",
    )


def _timelines() -> tuple[gaps.Timeline, ...]:
    """Three different timelines of one real H100 trace (tests/data): its steps judged after 1, 6 and 9 warm-up steps."""
    trace = trace_file.load(DATA / "item_loop.trace.json.gz")
    timelines = tuple(gaps.analyze(trace, warmup_steps=n) for n in (1, 6, 9))
    assert all(t is not None for t in timelines)
    return timelines  # type: ignore[return-value]


def _measured(budgets: tuple[Budget, ...]) -> MeasuredTest:
    guard = SyncGuard("test_x.py::test_loop", device="cpu")
    with guard.generation(tokens=4):
        for _ in range(8):
            torch.ones(2).sum().item()
    measurement = Measurement("cuda", 4, guard.measurements[0].events, region_numbers=(1, 2, 3), timelines=_timelines())
    checks, error = check_budgets("test_x.py::test_loop", budgets, measurement, require_gpu=False)
    assert error is None
    result = measured_test("test_x.py::test_loop", measurement, checks)
    comparison = compare({"syncs": 4, "max_gap_us": 10.0}, result.metrics, device="nvidia-h100", file="b.json",
                         tolerance=0.1, fingerprint={"torch": "2.11"}, drift={"torch": ("2.10", "2.11")})  # fmt: skip
    return MeasuredTest(**{**vars(result), "comparison": comparison, "notes": ("a note",)})


def test_every_rendering_reads_the_same_median_of_the_regions() -> None:
    result = _measured((Budget("max_gpu_idle_us", 1.0), Budget("min_gpu_busy", 0.99), Budget("max_syncs", 100)))
    per_region = sorted(t.gap_stat("max") for t in _timelines())
    median = per_region[1]
    assert per_region[0] < per_region[2]  # the regions differ, so "which one" matters
    idle, _busy, syncs = result.checks
    assert idle.value == pytest.approx(median) and idle.held is False
    assert result.metrics.values["max_gap_us"] == pytest.approx(median, rel=1e-5)
    assert result.metrics.runs["max_gap_us"] == 3
    assert syncs.value == 8 and syncs.held
    text = failure_text(result)
    assert f"GPU timeline (median of 3 regions): busy {result.metrics.values['busy_fraction']:.3f}, " in text
    assert f"max gap {median:.1f} us" in text and f"measured {median:.1f} us" in text
    assert result.timeline is not None and result.timeline.region in (1, 2, 3)
    assert f"region {result.timeline.region} of 3 (its max gap nearest the median)" in text
    assert "baseline nvidia-h100: syncs 4 -> 8" in text  # the regression, from the typed comparison
    (row,) = summary_lines([result])[2:3]
    assert f"{median:.1f}" in row.split()


def test_the_summary_and_the_failure_say_which_source_gave_the_gpu_timelines_and_why() -> None:
    budget = Budget("max_gpu_idle_us", 1.0)
    measured = _measured((budget,))
    sampled = choose(AUTO, lambda: None)
    fallback = choose(AUTO, lambda: "insufficient privileges to read GPU performance counters (ERR_NVGPUCTRPERM)")
    assert (sampled.name, fallback.name) == ("sampled", "trace") and fallback.fallback and not sampled.fallback
    results = [replace(measured, nodeid=f"t{i}", timeline_source=s) for i, s in enumerate((sampled, fallback))]
    lines = summary_lines(results)
    assert lines.count(sampled.describe()) == lines.count(fallback.describe()) == 1
    assert "the default where the GPU's counters can be read" in sampled.describe()
    assert "the trace stands in: the PM sampler cannot run here: insufficient privileges" in fallback.describe()
    assert "docs/howto/ci-gpu-runner.md" in fallback.describe()
    # A failing timeline budget says which source judged it; the results document keeps it.
    assert results[1].failed and f"syncguard: {fallback.describe()}" in failure_text(results[1])
    assert from_record(json.loads(json.dumps(record(results[1])))).timeline_source == fallback
    guard = SyncGuard("test_x.py::test_untimed", device="cpu")
    with guard.generation(tokens=2):
        torch.ones(2).sum().item()
    untimed = measured_test("test_x.py::test_untimed", guard.measurements[0], ())
    assert "max_gap_us" not in untimed.metrics
    assert not any(line.startswith("GPU timelines") for line in summary_lines([untimed]))


def test_forcing_the_sampler_where_it_cannot_run_is_an_error_and_the_trace_is_never_asked() -> None:
    with pytest.raises(SamplerUnavailable, match="--syncguard-timeline=sampled: the PM sampler cannot run here: x"):
        choose(SAMPLED, lambda: "x")
    asked: list[bool] = []
    assert choose(TRACE, lambda: asked.append(True) or None).why == "--syncguard-timeline=trace" and not asked


def test_the_real_samplers_error_path_gives_the_fallback_its_reason() -> None:
    """On a machine without CUDA's CUPTI (CI), the sampler's own loader fails, and that reason is what the fallback
    says; on a CUDA machine the sampler is tried on the device."""
    source = choose(AUTO, SAMPLER.unavailable)
    if torch.cuda.is_available():
        pytest.skip("the error path is taken where the sampler cannot run")
    assert source.fallback and "no libcupti in this process or beside torch" in source.why


def test_the_xdist_and_json_round_trip_gives_back_the_same_result() -> None:
    result = _measured((Budget("max_gpu_idle_us", 50.0, "p95"), Budget("max_syncs_per_token", 1)))
    assert "p95_gap_us" in result.metrics  # the gap statistic a budget read is a metric too
    data = json.loads(json.dumps(record(result)))
    assert from_record(data) == result
    assert data["syncs"] == 8 and data["syncs_per_token"] == 2.0 and data["regions"] == 3
    assert data["verdict"] == "fail"


def test_a_gap_diagnosis_travels_with_the_result_and_is_shown_apart_from_the_judged_gaps() -> None:
    """What --syncguard-gap-ops adds (a diagnostic rerun's widest region, host operators recorded) survives the
    xdist/JSON round trip, and the failure text shows it after the judged numbers, marked as not judged."""
    from dataclasses import replace

    result = _measured((Budget("max_gpu_idle_us", 1.0),))
    diagnosis = replace(_timelines()[0].summary(region=1), steps_from=gaps.GRAPH_STEPS)
    result = replace(result, gap_diagnosis=diagnosis)
    assert from_record(json.loads(json.dumps(record(result)))) == result
    text = failure_text(result).splitlines()
    header = next(i for i, line in enumerate(text) if "diagnostic rerun with every host operator recorded" in line)
    judged = next(i for i, line in enumerate(text) if line.startswith("GPU timeline"))
    assert judged < header
    assert "not the judged ones" in text[header]
    assert text[header + 1].strip().startswith(f"{diagnosis.top_gaps[0].duration_us:.1f} us")


def test_junit_properties_are_read_back_into_the_same_numbers(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import pytest, torch

        @pytest.mark.max_syncs_per_token(3)
        def test_loop(syncguard):
            syncguard.measure(lambda: [torch.ones(2).sum().item() for _ in range(4)], tokens=2, repeat=5)
        """
    )
    result = pytester.runpytest("--syncguard", "--junitxml=out.xml", "--syncguard-json=out.json")
    result.assert_outcomes(passed=1)
    (case,) = read_cases(pytester.path / "out.xml")
    (test,) = json.loads((pytester.path / "out.json").read_text())["tests"]
    assert test["regions"] == 5  # measure(repeat=5) is five regions
    assert dict(case.metrics.values) == test["metrics"]["values"] and dict(case.metrics.runs) == {
        name: n for name, n in test["metrics"]["runs"].items()
    }
    assert case.metrics.values["syncs_per_token"] == 2.0 and case.verdict == "pass" and case.baseline_status == "new"


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_a_cuda_region_on_a_machine_without_cuda_is_not_measured(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import pytest, torch

        @pytest.mark.syncguard(device="cuda")
        @pytest.mark.max_syncs(0)
        def test_loop(syncguard):
            with syncguard.generation(tokens=3):
                for _ in range(3):
                    torch.ones(2).sum().item()
        """
    )
    result = pytester.runpytest("--syncguard", "-rs")
    result.assert_outcomes(skipped=1)  # its one budget could not be measured: not a pass
    result.stdout.fnmatch_lines(
        [
            "*test_loop*max_syncs<=0*NOT MEASURED",
            "SKIPPED*syncguard: no budget measured on cuda: max_syncs: not measured*",
        ]
    )
    assert not (pytester.path / "baselines").exists()  # its numbers were not compared, nor recorded
    pytester.runpytest("--syncguard", "--syncguard-update-baselines").assert_outcomes(skipped=1)
    assert not (pytester.path / "baselines" / "cpu.json").exists()
    required = pytester.runpytest("--syncguard", "--syncguard-require-gpu")
    required.assert_outcomes(failed=1)
    required.stdout.fnmatch_lines(["*max_syncs: not measured: the region computes on 'cuda'*CUDA is not available*"])


def test_no_class_of_the_package_is_collected_as_a_test(pytester: pytest.Pytester) -> None:
    named_test = []
    for module_info in pkgutil.walk_packages(pytest_syncguard.__path__, "pytest_syncguard."):
        if module_info.name.endswith(".plugin"):
            continue
        module = importlib.import_module(module_info.name)
        named_test += [
            f"{module.__name__}.{n}" for n, v in vars(module).items() if inspect.isclass(v) and n.startswith("Test")
        ]
    assert named_test == []
    pytester.makepyfile(
        "from pytest_syncguard import *\nfrom pytest_syncguard.budgets import *\nfrom pytest_syncguard.capture import *\n"
        "from pytest_syncguard.document.measured import *\nfrom pytest_syncguard.result import *\n\ndef test_one():\n    pass\n"
    )
    pytester.runpytest("-W", "error::pytest.PytestCollectionWarning").assert_outcomes(passed=1)


def test_every_budget_kind_reads_a_known_metric() -> None:
    for name, kind in KINDS.items():
        stat = "p90" if name == "max_gpu_idle_us" else "max"
        spec = metric(kind.metric(stat))
        assert spec is not None and spec.runs is not None, name
        assert Budget(name, 0.5, stat).metric == spec
    assert Metrics.of(Measurement("cpu", None, ())).values == {"syncs": 0.0}


def test_a_budget_judges_the_value_the_summary_json_and_baseline_show() -> None:
    """One aggregation rule per metric: three regions whose allocator numbers differ give memory budgets, the
    metrics (summary, JSON results, baselines) and the summary row the same value, the worst region's."""
    from pytest_syncguard.analysis.memory import MemoryStats

    def stats(allocated_mib: int, reserved_mib: int) -> MemoryStats:
        return MemoryStats(0, allocated_mib << 20, reserved_mib << 20, 0, 0, 0, 0, 0, False)

    memory = (stats(60, 100), stats(50, 100), stats(90, 120))  # fragmentation 0.4, 0.5, 0.25; reserved 100-120
    measurement = Measurement("cuda", 4, (), region_numbers=(1, 2, 3), memory=memory)
    metrics = Metrics.of(measurement)
    budgets = [Budget("max_fragmentation", 0.45), Budget("max_reserved_mb", 110.0)]
    fragmentation, reserved = (b.check(measurement) for b in budgets)
    assert fragmentation.value == metrics["fragmentation"] == pytest.approx(0.5)
    assert reserved.value == metrics["reserved_mb"] == 120.0
    assert (fragmentation.held, reserved.held) == (False, False)
    assert metrics.runs["fragmentation"] == 3
    assert "measured 0.500: 1 - allocated peak 50.0 MiB / reserved peak 100.0 MiB" in fragmentation.text


def test_a_counters_metrics_budget_and_column_are_views_of_its_one_registry_entry() -> None:
    from pytest_syncguard.metrics import METRICS
    from pytest_syncguard.render.terminal import _COUNTER_COLUMNS
    from pytest_syncguard.signals import COUNTERS

    for spec in COUNTERS.values():
        judged = f"{spec.name}_per_token" if spec.per_token else spec.name
        assert METRICS[spec.name].description == spec.description and METRICS[judged].counted
        assert (judged in METRICS) and (f"{spec.name}_per_token" in METRICS) == spec.per_token
        if spec.budget is not None:
            kind = KINDS[spec.budget]
            assert (kind.metric("max"), kind.counter, kind.needs_tokens) == (judged, spec.name, spec.per_token)
            assert spec.description in (kind.signature.__doc__ or "")
        assert ((judged, spec.column) in _COUNTER_COLUMNS) == (spec.column is not None)
    assert len(_COUNTER_COLUMNS) == sum(spec.column is not None for spec in COUNTERS.values())
    # A counter's budget without a sentence of its own says what it counted, from its entry.
    breaks = Measurement("cpu", 2, (), region_numbers=(1,), region_counts={1: RegionCounts({"graph_breaks": 3})},
                         count_parts=((1,),))  # fmt: skip
    (check,), _ = check_budgets("t", [Budget("max_graph_breaks", 1.0)], breaks, require_gpu=False)
    assert (check.held, check.text) == (
        False,
        "max_graph_breaks: limit 1, measured 3 graph breaks taken while compiling",
    )


@pytest.fixture
def no_torch(tmp_path: Path) -> dict[str, str]:
    """An environment in which ``import torch`` fails."""
    blocker = tmp_path / "blocker" / "torch"
    blocker.mkdir(parents=True)
    (blocker / "__init__.py").write_text("raise ImportError('torch is made unimportable by this test')\n")
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(blocker.parent), str(Path(__file__).parents[1])])}


def _cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest_syncguard.gate.cli", *args], env=env, capture_output=True, text=True
    )


def test_the_cli_commands_run_without_torch(no_torch: dict[str, str], tmp_path: Path) -> None:
    assert subprocess.run([sys.executable, "-c", "import torch"], env=no_torch, capture_output=True).returncode == 1
    trace = _cli(no_torch, "trace", str(DATA / "graph_loop.trace.json.gz"))
    assert trace.returncode == 0, trace.stderr
    assert "largest gaps" in trace.stdout
    junit = tmp_path / "junit.xml"
    junit.write_bytes(
        __import__("gzip").decompress((DATA / "h100_suite" / "junit-nvidia-h100-80gb-hbm3.xml.gz").read_bytes())
    )
    report = _cli(no_torch, "report", str(junit), "--baselines", str(DATA / "h100_suite" / "baselines"))
    assert report.returncode == 0, report.stderr
    assert "syncguard" in report.stdout
    (baseline,) = (DATA / "h100_suite" / "baselines").glob("*.json")
    shown = _cli(no_torch, "baselines", str(baseline))
    assert shown.returncode == 0 and "tests" in shown.stdout, shown.stderr
    results = tmp_path / "results.json"  # the history job installs no torch either (gpu-history.yml)
    results.write_bytes(__import__("gzip").decompress((DATA / "h100_pr" / "unchanged.json.gz").read_bytes()))
    recorded = _cli(no_torch, "history", "record", str(results), "--commit", "a" * 40, "--into", str(tmp_path / "h"))
    assert recorded.returncode == 0 and "1 run" in recorded.stdout, recorded.stderr
    drawn = _cli(no_torch, "history", "page", str(tmp_path / "h"), "--out", str(tmp_path / "page.html"))
    assert drawn.returncode == 0, drawn.stderr

    from tests.test_comment import FakeGitHub

    github = FakeGitHub(tmp_path, [])
    posted = github.comment(env={**github.env(), "PYTHONPATH": no_torch["PYTHONPATH"]})
    assert posted.returncode == 0, posted.stderr
    assert "created comment" in posted.stdout


def test_the_gate_and_the_document_import_nothing_of_the_pytest_side(no_torch: dict[str, str]) -> None:
    """The results document (:mod:`pytest_syncguard.document`) lies below both sides: every module of the gate,
    imported together, loads neither pytest, torch, the markers' parser, the measurement nor the plugin."""
    code = (
        "import importlib, pkgutil, sys\n"
        "import pytest_syncguard.gate as gate, pytest_syncguard.document as document\n"
        "import pytest_syncguard.judge as judge, pytest_syncguard.render as render\n"
        "for package in (gate, document, judge, render):\n"
        "    for info in pkgutil.walk_packages(package.__path__, package.__name__ + '.'):\n"
        "        importlib.import_module(info.name)\n"
        "side = ['pytest', '_pytest', 'torch', 'pytest_syncguard.budgets', 'pytest_syncguard.result',\n"
        "        'pytest_syncguard.measurement', 'pytest_syncguard.guard', 'pytest_syncguard.capture',\n"
        "        'pytest_syncguard.plugin', 'pytest_syncguard.probes']\n"
        "print(sorted(name for name in sys.modules if name in side))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], env=no_torch, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_a_test_with_some_budgets_unmeasured_says_which_and_one_with_none_measured_is_skipped(
    pytester: pytest.Pytester,
) -> None:
    """It was counted as passed, with NOT MEASURED only in the summary's row."""
    pytester.makepyfile(
        """
        import pytest, torch

        @pytest.mark.max_syncs(10)
        @pytest.mark.max_gpu_idle_us(50)
        def test_some(syncguard):
            with syncguard.generation(tokens=1):
                torch.ones(2).sum().item()

        @pytest.mark.max_gpu_idle_us(50)
        def test_none(syncguard):
            with syncguard.generation(tokens=1):
                torch.ones(2).sum().item()
        """
    )
    result = pytester.runpytest_subprocess("--syncguard", "-rA", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, skipped=1)
    result.stdout.fnmatch_lines(["*- syncguard -*", "not measured on cpu: max_gpu_idle_us: not measured*"])
    result.stdout.fnmatch_lines(["SKIPPED * syncguard: no budget measured on cpu: max_gpu_idle_us: not measured*"])
