"""On CUDA, under each timeline source: a test that breaks its gap budget keeps its judged timeline as a Perfetto
file that its failure names, and that file reads back to the numbers the test was judged on, with a sync instant
at each counted ``.item()``."""

from __future__ import annotations

import json
import re
import statistics
from pathlib import Path

import pytest

from pytest_syncguard.render import perfetto

pytestmark = pytest.mark.gpu

LOOP = """
import pytest
import torch


@pytest.mark.max_gpu_idle_us(1)
def test_item_loop(syncguard):
    model = torch.nn.Sequential(*[torch.nn.Linear(512, 512) for _ in range(4)]).cuda()
    x = torch.randn(64, 512, device="cuda")

    def loop():
        y = x
        for _ in range(10):
            y = model(y).tanh()
            if y.sum().item() > 1e30:  # SYNC: one host read per step
                break

    syncguard.measure(loop, tokens=10, repeat=3, model=model)
"""


@pytest.mark.parametrize("source", ["trace", "sampled"])
def test_a_broken_gap_budget_keeps_the_judged_timeline_and_it_reads_back(
    pytester: pytest.Pytester, source: str
) -> None:
    written = pytester.makepyfile(test_loop=LOOP)
    line = next(i for i, text in enumerate(written.read_text().splitlines(), 1) if "SYNC" in text)
    artifacts = pytester.path / "artifacts"
    result = pytester.runpytest_subprocess(
        "--syncguard", f"--syncguard-timeline={source}", "--syncguard-require-gpu", "--syncguard-json",
        "results.json", "--syncguard-artifacts", str(artifacts), "-p", "no:cacheprovider",
    )  # fmt: skip
    out = result.stdout.str()
    print(out)
    result.assert_outcomes(failed=1)
    named = re.search(r"syncguard: judged timeline (\S+) \(open in ui\.perfetto\.dev", out)
    assert named is not None, out
    path = Path(named.group(1))
    assert path.parent == artifacts and path.name.endswith(perfetto.SUFFIX)
    meta, regions = perfetto.load(path)
    assert meta["source"] == source
    (shown,) = [r for r in regions if r.shown]
    (test,) = json.loads((pytester.path / "results.json").read_text())["tests"]
    metrics = test["metrics"]["values"]
    print(source, {k: metrics[k] for k in ("max_gap_us", "p99_gap_us", "busy_fraction")}, len(regions))
    # The test is judged on the median over its timed runs, each a region of the file; the summary shows the run
    # whose max gap is nearest that median.
    timelines = [r.timeline for r in regions]
    assert len(timelines) == 3  # measure(repeat=3): its timed runs
    assert statistics.median(t.gap_stat("max") for t in timelines) == pytest.approx(metrics["max_gap_us"], rel=1e-5)
    assert statistics.median(t.gap_stat("p99") for t in timelines) == pytest.approx(metrics["p99_gap_us"], rel=1e-5)
    assert statistics.median(t.busy_fraction for t in timelines) == pytest.approx(metrics["busy_fraction"], rel=1e-5)
    nearest = min(timelines, key=lambda t: abs(t.gap_stat("max") - metrics["max_gap_us"]))
    assert shown.timeline == nearest
    for region in regions:
        # Every judged gap is drawn; the .item() of each judged step is an instant with its call site.
        syncs = region.timeline.syncs
        odd = [s.label for s in syncs if f"test_loop.py:{line} in " not in s.label or not s.label.endswith(".loop")]
        assert syncs and not odd, odd
        assert len(region.timeline.gaps_us) >= len(region.timeline.top_gaps) > 0
    # One .item() per judged step (the warm-up steps are not judged), under either source.
    assert all(len(r.timeline.syncs) == r.timeline.judged_steps > 0 for r in regions), [
        (len(r.timeline.syncs), r.timeline.judged_steps) for r in regions
    ]
    if source == "trace":
        assert all(r.timeline.judged_steps == len(r.timeline.step_spans) for r in regions)
