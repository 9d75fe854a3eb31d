"""The exact counters against independent counts of the same code: torch.profiler's cpu_op events for
operators, dynamo's own counters and cache entries for torch.compile, and the construction of real CUDA traces
for launches, copies and memsets."""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from pytest_syncguard import SyncGuard
from pytest_syncguard.analysis import gaps, trace_file
from pytest_syncguard.analysis.counts import RegionCounts
from pytest_syncguard.analysis.device_work import device_work
from pytest_syncguard.analysis.trace_file import profiler_only
from pytest_syncguard.budgets import check_budgets
from pytest_syncguard.document.budget import Budget
from pytest_syncguard.judge.comparison import compare
from pytest_syncguard.measurement import Measurement
from pytest_syncguard.metrics import Metrics
from pytest_syncguard.probes.native import NATIVE
from pytest_syncguard.render.terminal import failure_text
from pytest_syncguard.result import measured_test

transformers = pytest.importorskip("transformers")
from examples import models  # noqa: E402
from examples.strategies import CUDA_ONLY, STRATEGIES  # noqa: E402

DATA = Path(__file__).parent / "data"
needs_native = pytest.mark.skipif(
    NATIVE.load() is None, reason=f"the native extension is needed to count operators: {NATIVE.unavailable}"
)


def profiled_ops(fn: Callable[[], object], tmp_path: Path) -> Counter[str]:
    """The operators torch.profiler records (``cpu_op`` events of its trace) over one unmeasured call, without
    the ranges that exist only under the profiler."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    path = tmp_path / "ops.trace.json"
    prof.export_chrome_trace(str(path))
    events = json.loads(path.read_text())["traceEvents"]
    return Counter(e["name"] for e in events if e.get("cat") == "cpu_op" and not profiler_only(e["name"]))


def counted_ops(fn: Callable[[], object]) -> tuple[int | None, dict[str, int]]:
    guard = SyncGuard("counted", device="cpu")
    with guard.generation(tokens=1) as region:
        fn()
    assert region.measurement is not None
    return region.count("ops"), dict(region.measurement.count_top("ops"))


@needs_native
@pytest.mark.parametrize("name", [n for n in STRATEGIES if n not in CUDA_ONLY])
def test_operator_count_equals_the_profilers_cpu_ops(name: str, tmp_path: Path) -> None:
    """Counted in one run, profiled in the next: the same total, and the same count for every operator the
    plugin lists. The profiled run has no plugin in it, so an operator the plugin itself dispatched would show."""
    model = models.gpt2("cpu", tiny=True)
    prompt = torch.randint(0, 512, (2, 6), generator=torch.Generator().manual_seed(3))

    def run() -> object:
        return STRATEGIES[name](model, prompt, 8, 512)

    run()  # compiles static_compiled, warms every cache
    total, top = counted_ops(run)
    truth = profiled_ops(run, tmp_path)
    assert total == sum(truth.values()) > 8 * 50
    assert top and all(truth[op] == n for op, n in top.items()), (top, truth.most_common(8))


@needs_native
def test_the_probes_own_rules_dispatch_no_operator(tmp_path: Path) -> None:
    """Every operator the sync probe has a rule for, counted against the profiler of an unmeasured run."""
    x = torch.arange(12.0).reshape(3, 4)
    mask = x > 5

    def run() -> object:
        y = x.clone()
        y[mask] = torch.tensor(1.0)
        y[mask] = 2.0
        return (
            torch.equal(x, x), torch.equal(x, y), torch.equal(x, x[:2]), x.nonzero(), x[mask], x.unique(),
            x.unique_consecutive(dim=0), torch.masked_select(x, mask), x.sum().item(), bool(mask.any()),
            torch.repeat_interleave(torch.tensor([1, 2])), x.tolist(),
        )  # fmt: skip

    run()
    total, top = counted_ops(run)
    truth = profiled_ops(run, tmp_path)
    assert total == sum(truth.values())
    assert all(truth[op] == n for op, n in top.items()), (top, truth.most_common(8))


@needs_native
def test_operators_of_other_threads_count_and_none_outside_regions() -> None:
    import threading

    x = torch.ones(3)
    guard = SyncGuard("threads", device="cpu")
    with guard.generation(tokens=1) as region:
        worker = threading.Thread(target=lambda: [x.sin() for _ in range(5)])
        worker.start()
        worker.join()
        x.cos()
    x.tan()  # after the region: not counted anywhere
    assert region.count("ops") == 6
    assert region.measurement is not None and dict(region.measurement.count_top("ops")) == {
        "aten::sin": 5, "aten::cos": 1,
    }  # fmt: skip


def test_without_the_native_extension_operators_are_not_counted_and_say_why(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SYNCGUARD_NATIVE", "0")
    pytester.makepyfile(
        """
import pytest, torch

@pytest.mark.max_ops_per_token(1000)
def test_counted(syncguard):
    with syncguard.generation(tokens=1):
        torch.ones(2).sin()
"""
    )
    result = pytester.runpytest_subprocess("--syncguard", "-p", "no:cacheprovider", "-rA")
    result.assert_outcomes(skipped=1)  # nothing failed; the budget is not measured, never passed
    result.stdout.fnmatch_lines(
        [
            "*max_ops_per_token<=1000*NOT MEASURED*",
            "SKIPPED*syncguard: no budget measured on cpu: max_ops_per_token: not measured*",
        ]
    )


@needs_native
def test_a_failing_operator_budget_lists_the_largest_operators(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
import pytest, torch

@pytest.mark.max_ops_per_token(2)
def test_ops(syncguard):
    x = torch.ones(3)
    with syncguard.generation(tokens=2):
        for _ in range(2):
            x = x.sin().cos()
            x = x.sin()
"""
    )
    result = pytester.runpytest("--syncguard", "-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "  max_ops_per_token: limit 2 per token, measured 3.0: 6 operators over 2 tokens",
            "largest operators (ops of 6, most first):",
            "        4 x aten::sin",
            "        2 x aten::cos",
        ]
    )


def _shaped(x: torch.Tensor) -> torch.Tensor:
    return x * 2


def test_a_failing_recompile_budget_names_the_frame_and_dynamos_reason() -> None:
    compiled = torch.compile(_fresh(_shaped), backend="eager", dynamic=False)
    compiled(torch.ones(2))
    guard = SyncGuard("test_recompiles", device="cpu")
    with guard.generation(tokens=1):
        compiled(torch.ones(3))
    budget = Budget("max_recompiles", 0)
    measurement = Measurement.combine(guard.measurements)
    checks, _ = check_budgets("test_recompiles", [budget], measurement, require_gpu=False)
    text = failure_text(measured_test("test_recompiles", measurement, checks)).splitlines()
    assert text[1:3] == [
        "  max_recompiles: limit 0, measured 1 recompilations (1 frames compiled in the region)",
        "largest recompile reasons (recompiles of 1, most first):",
    ]
    # The frame's place, then dynamo's reason, prefixed with the compile id it failed the guard of.
    assert re.fullmatch(r"        1 x test_counters\.py:\d+ _shaped: \d+/0: .*size mismatch at index 0.*", text[3])


def _fresh(fn: Callable[..., Any]) -> Callable[..., Any]:
    """A new function object with its own code, so dynamo has compiled nothing of it yet."""
    code = fn.__code__.replace()
    return type(fn)(code, fn.__globals__, fn.__name__)


def _two_breaks(x: torch.Tensor) -> torch.Tensor:
    x = x.sin()
    torch._dynamo.graph_break()
    x = x.cos()
    torch._dynamo.graph_break()
    return x * 2


def _no_break(x: torch.Tensor) -> torch.Tensor:
    return x.sin() + 1


def test_compile_counters_equal_dynamos_own_counts() -> None:
    import torch._dynamo
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list
    from torch._dynamo.utils import counters

    breaking, plain = _fresh(_two_breaks), _fresh(_no_break)
    truth_breaks = torch._dynamo.explain(_fresh(_two_breaks))(torch.ones(3)).graph_break_count
    compiled_plain = torch.compile(plain, backend="eager", dynamic=False)
    compiled_plain(torch.ones(2))
    frames_before = counters["frames"]["ok"]
    guard = SyncGuard("compiles", device="cpu")
    with guard.generation(tokens=1) as region:
        torch.compile(breaking, backend="eager")(torch.ones(3))
        for size in (3, 4, 5):  # three new shapes of a static-shape compile: three recompilations
            compiled_plain(torch.ones(size))
    assert region.count("graph_breaks") == truth_breaks == 2
    assert region.count("recompiles") == len(_debug_get_cache_entry_list(plain.__code__)) - 1 == 3
    assert region.count("frames_compiled") == counters["frames"]["ok"] - frames_before == 6
    assert region.measurement is not None
    reasons = dict(region.measurement.count_top("recompiles"))
    assert sum(reasons.values()) == 3 and all("_no_break" in r and "size mismatch" in r for r in reasons)


def test_compile_counters_are_zero_without_compiling_and_quiet_unless_budgeted() -> None:
    guard = SyncGuard("quiet", device="cpu")
    with guard.generation(tokens=1) as region:
        torch.ones(2).sin()
    assert region.count("recompiles") == 0 and region.count("graph_breaks") == 0
    assert region.measurement is not None
    assert "recompiles" not in Metrics.of(region.measurement).values
    assert Metrics.of(region.measurement, extra=["recompiles"]).values["recompiles"] == 0


def test_an_absent_compile_counter_compares_as_zero() -> None:
    now = Metrics({"syncs": 1.0, "recompiles": 2.0}, {"syncs": 1, "recompiles": 1})
    regressed = compare({"syncs": 1.0}, now, device="cpu", file="b.json", tolerance=0.1)
    assert [(c.metric, c.old, c.new, c.status) for c in regressed.changes if c.metric == "recompiles"] == [
        ("recompiles", 0.0, 2.0, "regression")
    ]
    fixed = compare({"syncs": 1.0, "recompiles": 2.0}, Metrics({"syncs": 1.0}, {"syncs": 1}), device="cpu",
                    file="b.json", tolerance=0.1)  # fmt: skip
    assert fixed.status == "improvement"


def _region_work(name: str) -> RegionCounts:
    trace = trace_file.load(DATA / f"{name}.trace.json.gz")
    (window,) = gaps.regions(trace).values()
    return device_work(trace, window)


def test_device_work_of_a_real_eager_trace_matches_how_it_was_made() -> None:
    """12 steps of 8 x (matmul + tanh) and a .item() (tests/data/README.md): cuBLAS splits each matmul into a
    gemm and a split-K reduction, the .item() is one sum kernel, one memset and one 4-byte copy to the host."""
    work = _region_work("item_loop")
    assert work.values == {
        "launches": 12 * (8 * 3 + 1), "graph_launches": 0, "graph_kernels": 0, "copies_h2d": 0, "copy_bytes_h2d": 0,
        "copies_d2h": 12, "copy_bytes_d2h": 12 * 4, "copies_d2d": 0, "copy_bytes_d2d": 0, "memsets": 12,
    }  # fmt: skip
    kernels = dict(work.top["launches"])
    assert sorted(kernels.values()) == [12, 96, 96, 96]


def test_device_work_of_a_real_graph_trace_counts_graph_launches_and_their_kernels() -> None:
    """The same 12 steps replayed as one CUDA graph each, the input copied into the graph's 1 MiB buffer."""
    work = _region_work("graph_loop")
    assert work.values["launches"] == work.values["graph_launches"] == 12
    assert work.values["graph_kernels"] == 12 * 8 * 3
    assert (work.values["copies_d2d"], work.values["copy_bytes_d2d"]) == (12, 12 * 256 * 1024 * 4)
    assert dict(work.top["launches"]) == {"(CUDA graph launch)": 12}
