"""On CUDA: measure a loop with a host read per step under each timeline source, write its judged timelines as the
plugin's Perfetto file, read the file back and print, per run, the judged busy time, span and gaps against the
read-back ones, with what differs. ``python devtools/check_timeline_file.py [OUT_DIR]`` (the files stay there;
``SYNCGUARD_CHECK_ROUNDS=N`` measures each source N times)."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import torch

from pytest_syncguard.budgets import GuardOptions
from pytest_syncguard.capture import CallCapture
from pytest_syncguard.document.budget import Budget
from pytest_syncguard.guard import SyncGuard
from pytest_syncguard.render import perfetto
from pytest_syncguard.timeline_source import TimelineSource


def loop_of() -> object:
    model = torch.nn.Sequential(*[torch.nn.Linear(512, 512) for _ in range(4)]).cuda()
    x = torch.randn(64, 512, device="cuda")

    def loop() -> None:
        y = x
        for _ in range(10):
            y = model(y).tanh()
            if y.sum().item() > 1e30:
                break

    return loop, model


def check(source: str, out: Path) -> None:
    loop, model = loop_of()  # type: ignore[misc]
    guard = SyncGuard(source, device="cuda")
    chosen = TimelineSource(source, "devtools/check_timeline_file.py")
    capture = CallCapture.of(source, guard, [Budget("max_gpu_idle_us", 1.0)], GuardOptions(), source=lambda: chosen)
    with capture.recording():
        guard.measure(loop, tokens=10, repeat=3, model=model)
    try:
        measurement = capture.with_timelines(guard.measurements[0])
    finally:
        capture.keep(None, failed=False)
    timelines = [t for t in measurement.timelines if t is not None]
    regions = [perfetto.Region(i + 1, t) for i, t in enumerate(timelines)]
    path = perfetto.write(out / f"{source}{perfetto.SUFFIX}", source, source, regions)
    _, back = perfetto.load(path)
    print(f"{source}: {path} ({path.stat().st_size} bytes), problem {measurement.unreliable_timeline}")
    for judged, read in zip(timelines, back, strict=True):
        r = read.timeline
        runs = judged.runs
        odd = [x for x in runs if x.end <= x.start]
        over = [x for x in runs if x.busy > x.end - x.start + 1e-6]
        order = [i for i in range(len(runs) - 1) if runs[i].end >= runs[i + 1].start]
        print(f"  busy {judged.busy_us:.3f} / {r.busy_us:.3f} us, span {judged.span_us:.3f} / {r.span_us:.3f}, "
              f"gaps {len(judged.gaps_us)} / {len(r.gaps_us)}, runs {len(runs)} / {len(r.runs)}, "
              f"sum(run busy) {sum(x.busy for x in runs):.3f}, empty runs {len(odd)}, busier than long {len(over)}, "
              f"out of order {len(order)} {[(runs[i], runs[i + 1]) for i in order[:2]]}")  # fmt: skip


def main() -> int:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tempfile.mkdtemp(prefix="syncguard-timeline-file-"))
    out.mkdir(parents=True, exist_ok=True)
    for source in ("trace", "sampled") * int(os.environ.get("SYNCGUARD_CHECK_ROUNDS", "1")):
        check(source, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
