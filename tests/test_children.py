"""A measured test's Python child processes (an engine core started with multiprocessing, a forked worker, a Python
subprocess, their own children) are measured with it: what they sync inside the test's regions counts against its
budgets, per its tokens, each sync named by its process and its line there; a child that is not Python is said,
and a test that does not measure starts its processes as they were."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import torch

from tests import warm

ENGINE = """
import multiprocessing as mp
import os
import signal
import subprocess
import sys

import pytest
import torch

STEP = '''
import torch
x = torch.ones(4)
for _ in range(8):
    if bool((x > 100).any()):  # the subprocess's host read
        break
    x = x + 1
'''

COMPILE = '''
import json, sys, torch
import torch._dynamo.utils as utils

@torch.compile(backend="eager", dynamic=False)
def layer(x):
    y = x * 2
    torch._dynamo.graph_break()
    return y + 1

for n in (4, 4, 5):
    layer(torch.ones(n))
records = [r for r in utils.get_compilation_metrics() if not r.is_runtime]
with open("truth.json", "w") as out:
    json.dump({"frames": len(records), "recompiles": sum(1 for r in records if r.recompile_reason)}, out)
'''


def engine(steps, requests, replies, kill):
    x = torch.ones(4)
    for step in range(steps):
        if kill and step == 4:
            os.kill(os.getpid(), signal.SIGKILL)
        if bool((x > 100).any()):  # the engine's host read
            break
        x = x + 1
    replies.put(float(x.sum().item() if False else 0.0))


def _serve(method, kill=False):
    context = mp.get_context(method)
    requests, replies = context.Queue(), context.Queue()
    process = context.Process(target=engine, args=(8, requests, replies, kill))
    process.start()
    if not kill:
        replies.get(timeout=120)
    process.join(timeout=120)


@pytest.mark.max_syncs_per_token(0)
@pytest.mark.parametrize("method", ["spawn", "fork", "forkserver"])
def test_engine(syncguard, method):
    with syncguard.generation(tokens=8):
        _serve(method, kill=method == "spawn")  # the spawned one is killed mid-loop


@pytest.mark.max_syncs_per_token(0)
def test_subprocess_of_a_subprocess(syncguard):
    inner = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {STEP!r}], check=True)"
    with syncguard.generation(tokens=8):
        subprocess.run([sys.executable, "-c", inner], check=True)


@pytest.mark.max_graph_breaks(0)
def test_compiling_child(syncguard):
    with syncguard.generation(tokens=3):
        subprocess.run([sys.executable, "-c", COMPILE], check=True)


@pytest.mark.max_syncs_per_token(0)
def test_binary(syncguard):
    with syncguard.generation(tokens=8):
        subprocess.run(["true"], check=True)



def test_unmeasured():
    found = subprocess.run([sys.executable, "-c", "import os, sys; print(os.environ.get('SYNCGUARD_CHILDREN'), 'sitecustomize' in sys.modules and 'syncguard' in repr(sys.modules['sitecustomize']))"], capture_output=True, text=True, check=True)
    assert found.stdout.split() == ["None", "False"], found.stdout
"""


@pytest.mark.skipif(torch.cuda.is_available(), reason="the engines read CPU tensors, which on a CUDA run are no sync")
def test_each_start_method_s_child_syncs_count_with_the_test_named_by_its_process_and_line(
    pytester: pytest.Pytester,
) -> None:
    """spawn (killed mid-loop), fork and forkserver engines, a subprocess's subprocess: each one's host reads inside
    the region fail the test's budget, named by the process and its line; a subprocess's compilations count as
    dynamo's records in it say; a binary is said, not measured; a test that does not measure starts its processes
    without the hook. (That what a child does before the region is not
    the region's: the engine example's warm-up request, in its fixture.)"""
    pytester.makepyfile(test_engine=ENGINE)
    done = pytester.runpytest_subprocess("--syncguard", "--syncguard-json", "r.json", "-p", "no:cacheprovider")
    out = done.stdout.str()
    tests = {t["nodeid"].split("::")[1]: t for t in json.loads((pytester.path / "r.json").read_text())["tests"]}
    for method in ("fork", "forkserver"):
        test = tests[f"test_engine[{method}]"]
        assert test["verdict"] == "fail" and test["metrics"]["values"]["syncs"] == 8, (method, test["notes"])
        (note,) = [n for n in test["notes"] if "started" in n]
        assert "(engine) started at test_engine.py:" in note and "8 sync(s) during the test; exit 0" in note
    assert "8 x scalar read (aten::_local_scalar_dense in child process" in out
    assert (
        "(engine)) at test_engine.py:" in out
        and "in engine: if bool((x > 100).any()):  # the engine's host read" in out
    )
    # Spawned, and killed mid-loop: the syncs it made before are kept, and the note says how it ended.
    killed = tests["test_engine[spawn]"]
    assert killed["metrics"]["values"]["syncs"] == 4 and any("killed by SIGKILL" in n for n in killed["notes"])
    # A child of a child: measured, named by who started it.
    nested = tests["test_subprocess_of_a_subprocess"]
    assert nested["metrics"]["values"]["syncs"] == 8 and any("started by process" in n for n in nested["notes"])
    # Not Python: said, never counted as measured.
    binary = tests["test_binary"]
    assert any("true (pid" in n and "not measured: not a Python process" in n for n in binary["notes"])
    # ... and the sync budget it would have passed is not measured, not passed.
    assert binary["verdict"] == "not measured", binary["checks"]
    (check,) = binary["checks"]
    assert check["held"] is None and "is not a Python process: its syncs cannot be counted" in check["text"]
    # A child's compilations: its frames, recompiles and graph breaks as dynamo's own records in it say.
    truth = json.loads((pytester.path / "truth.json").read_text())
    compiled = tests["test_compiling_child"]
    values = compiled["metrics"]["values"]
    assert (values["frames_compiled"], values["recompiles"]) == (truth["frames"], truth["recompiles"]) != (0, 0)
    assert compiled["verdict"] == "fail" and values["graph_breaks"] >= 1
    assert "in layer in child process" in out
    done.assert_outcomes(failed=5, passed=1, skipped=1)  # the binary's test: its one budget not measured


def test_the_start_up_hook_runs_the_sitecustomize_it_hides(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A project's own sitecustomize still runs in a measured test's children."""
    own = pytester.mkdir("own")
    (own / "sitecustomize.py").write_text("import os\nos.environ['OWN_SITECUSTOMIZE'] = 'ran'\n")
    monkeypatch.setenv("PYTHONPATH", str(own) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    pytester.makepyfile(
        test_own="""
        import subprocess, sys

        def test_child(syncguard):
            with syncguard.generation(tokens=1):
                out = subprocess.run([sys.executable, "-c", "import os; print(os.environ.get('OWN_SITECUSTOMIZE'))"],
                                     capture_output=True, text=True, check=True).stdout
            assert out.strip() == "ran"
        """
    )
    pytester.runpytest_subprocess("--syncguard", "-p", "no:cacheprovider").assert_outcomes(passed=1)


OPERATING_CHILD = """
import json, sys
import torch
from torch.profiler import ProfilerActivity, profile

from pytest_syncguard.analysis.trace_file import profiler_only


def loop():
    x = torch.ones(8)
    for _ in range(20):
        x = torch.tanh(x * 1.5 + 1)
    return x


truth = 0
if "--truth" in sys.argv:  # the profiler's operators of one run (1.4 s of the child's CPU: the counted child only)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        loop()
    prof.export_chrome_trace("trace.json")
    with open("trace.json") as trace:
        events = json.load(trace)["traceEvents"]
    truth = sum(1 for e in events if e.get("cat") == "cpu_op" and not profiler_only(e["name"]))
print(truth, flush=True)
sys.stdin.readline()  # the test's region is open
loop()
print("done", flush=True)
sys.stdin.readline()
"""

OPERATING_TEST = """
import json, os, subprocess, sys
import pytest

def ask(syncguard, name, environment, *args):
    child = subprocess.Popen([sys.executable, "child.py", *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True, env={**os.environ, **environment})
    truth = int(child.stdout.readline())  # its profiled run, before the region: not the region's
    with syncguard.generation(tokens=1):
        child.stdin.write("go\\n")
        child.stdin.flush()
        assert child.stdout.readline() == "done\\n"
    child.communicate("end\\n", timeout=60)
    with open(f"{name}.truth", "w") as out:
        json.dump(truth, out)

@pytest.mark.max_ops_per_token(5)
def test_counted(syncguard):
    ask(syncguard, "counted", {}, "--truth")

@pytest.mark.max_ops_per_token(5)
def test_uncounted(syncguard):
    ask(syncguard, "uncounted", {"SYNCGUARD_NATIVE": "0"})
"""


def test_a_childs_operators_in_the_region_are_the_profilers_and_one_not_counted_is_said(
    pytester: pytest.Pytester,
) -> None:
    """A child's operators inside the region join the test's, as many as torch.profiler records for a run of the
    same loop (its profiled run before the region is not the region's), as one item named by the child; a child that
    cannot count its own (no native counter) makes the budget not measured, naming it, never passed on the test
    process's 0."""
    from pytest_syncguard.probes.native import NATIVE

    if NATIVE.load() is None:
        pytest.skip(f"the native operator counter {NATIVE.unavailable}")
    pytester.makepyfile(child=OPERATING_CHILD, test_operating=OPERATING_TEST)
    done = pytester.runpytest_subprocess("--syncguard", "--syncguard-json", "r.json", "-p", "no:cacheprovider")
    tests = {t["nodeid"].split("::")[1]: t for t in json.loads((pytester.path / "r.json").read_text())["tests"]}
    truth = json.loads((pytester.path / "counted.truth").read_text())
    counted = tests["test_counted"]
    assert truth > 20 and counted["metrics"]["values"]["ops"] == truth, (truth, counted["metrics"]["values"])
    assert counted["verdict"] == "fail" and "every operator of child process" in done.stdout.str()
    uncounted = tests["test_uncounted"]
    assert "ops" not in uncounted["metrics"]["values"]  # (on CUDA its race budget is measured: a verdict of its own)
    check = next(c for c in uncounted["checks"] if c["budget"]["marker"] == "max_ops_per_token")
    assert check["held"] is None and (
        "operators run in child processes are not counted, and these ran in the region: child process"
        in (check["text"])
        and "the native operator counter is switched off by SYNCGUARD_NATIVE=0" in check["text"]
    ), check["text"]


EXAMPLE = Path(__file__).parents[1] / "examples" / "test_engine_core.py"


def test_a_read_planted_in_the_engine_core_example_fails_its_budget_by_the_engines_line() -> None:
    """The engine process (spawn, started by a module fixture) decodes the tiny model; the test process only asks.
    A host read planted in the engine breaks the budget its one stop check a step holds (16 of them over 16
    tokens, under 1.125 a token), named at its line in the engine."""
    environment = {**os.environ, "SYNCGUARD_PLANT_ENGINE_READ": "1"}
    done = warm.run([sys.executable, "-m", "pytest", str(EXAMPLE), "--syncguard", "-q", "-p", "no:cacheprovider"],
                    cwd=EXAMPLE.parents[1], env=environment, timeout=300)  # fmt: skip
    out = done.stdout
    assert done.returncode == 1, out[-3000:] + done.stderr[-3000:]
    syncs = 34 if torch.cuda.is_available() else 32  # on CUDA the prompt's upload and the reply's download too
    assert "(engine_core), started by process" in out and f"{syncs} sync(s) during the test" in out
    planted = "16 x scalar read (aten::_local_scalar_dense in child process"
    lines = EXAMPLE.read_text().splitlines()
    read, check = (1 + next(i for i, text in enumerate(lines) if code in text) for code in ("_ = int(", "if bool("))
    assert planted in out and f"(engine_core)) at examples/test_engine_core.py:{read} in decode: _ = int(" in out
    assert f"(engine_core)) at examples/test_engine_core.py:{check} in decode: if bool(finished.all())" in out


def test_a_childs_file_is_read_on_from_where_the_last_read_stopped_and_a_cut_line_waits(tmp_path: Path) -> None:
    """The session's files grow with a long-lived engine's every sync: each read takes only the new lines, a line not
    yet ended (or cut by a kill) is not read, and syncs before a test's end are forgotten after it."""
    from pytest_syncguard.probes import children

    def event(t: int, line: int) -> str:
        return json.dumps({"t": t, "e": ["scalar read", "aten::_local_scalar_dense", 1, [["e.py", line, "f"]], 0, 0]})

    path = tmp_path / "41.jsonl"
    path.write_text(json.dumps({"pid": 41, "ppid": 1, "argv": ["python", "e.py"]}) + "\n" + event(10, 1) + "\n")
    (child,) = children.read(tmp_path)
    assert child.pid == 41 and [t for t, _ in child.syncs] == [10] and "child process 41 (python e.py)" in child.label
    with path.open("a") as out:
        out.write(json.dumps({"name": "engine_core"}) + "\n" + event(20, 2) + "\n" + event(30, 3)[:25])
    (child,) = children.read(tmp_path)
    assert [t for t, _ in child.syncs] == [10, 20] and child.syncs[1][1].op.endswith(
        "in child process 41 (engine_core)"
    )
    with path.open("a") as out:
        out.write(event(30, 3)[25:] + "\n")
    (child,) = children.read(tmp_path, since_ns=15)
    assert [t for t, _ in child.syncs] == [20, 30] and child.syncs[1][1].stack[0].lineno == 3
    children.forget()


COPYING_CHILD = """
import json
import ctypes
import torch

device = torch.ones(1000, device="cuda")
pinned = torch.ones(500).pin_memory()
moved = {"h2d": 0, "d2h": 0}
for _ in range(4):
    moved["d2h"] += device.cpu().nbytes  # the child's download
    moved["h2d"] += torch.ones(250).cuda().nbytes  # the child's upload
moved["h2d"] += pinned.to("cuda", non_blocking=True).nbytes
ctypes.CDLL("libcuda.so.1").cuCtxSynchronize()  # a sync outside torch
with open("moved.json", "w") as out:
    json.dump(moved, out)
"""

COPYING_TEST = """
import subprocess, sys
import pytest

@pytest.mark.max_transfer_bytes_d2h_per_token(1000)
@pytest.mark.max_syncs_per_token(0)
def test_copies(syncguard):
    with syncguard.generation(tokens=4):
        subprocess.run([sys.executable, "child.py"], check=True)
"""


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_childs_copies_count_to_the_byte_with_its_line_and_its_cuda_calls_as_syncs(pytester: pytest.Pytester) -> None:
    """A subprocess's copies between host and device are the region's transfers, to the byte its tensors' sizes say,
    each named by its process and line, and a blocking CUDA call it makes outside torch is a sync of the test's."""
    pytester.makepyfile(child=COPYING_CHILD, test_copying=COPYING_TEST)
    done = pytester.runpytest_subprocess("--syncguard", "--syncguard-json", "r.json", "-p", "no:cacheprovider")
    out = done.stdout.str()
    (test,) = json.loads((pytester.path / "r.json").read_text())["tests"]
    moved, values = json.loads((pytester.path / "moved.json").read_text()), test["metrics"]["values"]
    assert (values["transfer_bytes_h2d"], values["transfer_bytes_d2h"]) == (moved["h2d"], moved["d2h"]), values
    assert (values["transfers_h2d"], values["transfers_d2h"]) == (5, 4), values
    assert test["verdict"] == "fail", test["checks"]
    lines = COPYING_CHILD.strip().splitlines()
    download, outside = (
        1 + next(i for i, text in enumerate(lines) if mark in text) for mark in ("download", "outside")
    )
    assert f"child.py:{download} in <module>: cudaMemcpyAsync in child process" in out, out
    assert "device-to-host, 4000 B" in out and f"child.py:{outside} in <module>" in out, out
    assert values["syncs"] >= 1 and "CUDA call outside torch (cuCtxSynchronize in child process" in out, out


def test_a_childs_copies_and_unread_copy_calls_are_the_regions_inside_its_window(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a child's file says of its copies is read as the CUDA-call probe's transfers, named by the child and
    taken by the window they fall in; a child whose calls could not be watched is said by every region after its
    start (its copies unknown, never zero)."""
    from pytest_syncguard.probes import children

    monkeypatch.setenv(children.FOLDER_VARIABLE, str(tmp_path))
    monkeypatch.setenv(children.OWNER_VARIABLE, str(os.getpid()))
    lines = [
        {"pid": 7, "ppid": 1, "argv": ["python", "engine.py"], "t": 5},
        {"t": 10, "x": ["d2h", 4000, "cudaMemcpyAsync", ["engine.py", 3, "step"], None]},
        {"t": 20, "n": "cudaMemcpy3D"},
        {"t": 30, "x": ["h2d", 64, "cuMemcpyHtoD", ["engine.py", 4, "step"], ["client.py", 9, "ask"]]},
    ]
    (tmp_path / "7.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    try:
        copies = children.copies_in((15, 40))
        assert [(x.direction, x.size) for x in copies.transfers] == [("h2d", 64)] and not copies.not_counted
        assert copies.transfers[0].label() == (
            "engine.py:4 in step (called from client.py:9 in ask): cuMemcpyHtoD in child process 7 (python "
            "engine.py), host-to-device, 64 B"
        )
        assert copies.not_read == ("cudaMemcpy3D in child process 7 (python engine.py)",)
        assert [x.size for x in children.copies_in((0, 12)).transfers] == [4000]
        unwatched = {"pid": 8, "argv": ["python", "other.py"], "t": 50}, {"t": 51, "u": "no CUPTI library"}
        (tmp_path / "8.jsonl").write_text("".join(json.dumps(line) + "\n" for line in unwatched))
        assert children.copies_in((15, 40)).not_counted == ()  # it started after that window
        assert children.copies_in((45, 60)).not_counted == ("child process 8 (python other.py): no CUPTI library",)
    finally:
        for path in (tmp_path / "7.jsonl", tmp_path / "8.jsonl"):
            children._FILES.pop(path, None)
        children.forget()


COMPUTING_CHILD = """
import sys
import torch

a = torch.randn(2048, 2048, device="cuda")
a @ a  # cuBLAS's handle and kernels chosen before the region
torch.cuda.synchronize()
print("ready", flush=True)
sys.stdin.readline()
began, ended = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
began.record()
for _ in range(200):
    a = torch.tanh(a @ a / 64)
ended.record()
torch.cuda.synchronize()
print(began.elapsed_time(ended), flush=True)  # the device's own clock: ms from the loop's first kernel to its last
sys.stdin.readline()
"""

COMPUTING_TEST = """
import json, subprocess, sys
import pytest

@pytest.mark.max_gpu_idle_us(1_000_000)
def test_engine(syncguard):
    child = subprocess.Popen([sys.executable, "child.py"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline() == "ready\\n"
    with syncguard.generation(tokens=1):
        child.stdin.write("go\\n")
        child.stdin.flush()
        elapsed_ms = float(child.stdout.readline())
    child.communicate("end\\n", timeout=60)
    with open("elapsed.json", "w") as out:
        json.dump(elapsed_ms, out)
"""


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_childs_kernels_are_in_the_sampled_timeline_and_a_trace_says_it_cannot_see_them(
    pytester: pytest.Pytester,
) -> None:
    """The sampler reads the whole device: a child's kernels are the region's timeline (its span the one the child's
    own CUDA events time around its loop), though the test process launched none; a trace records the test's
    process alone, so there the timeline budget fails as unreliable, naming the child, never judged on an empty
    trace."""
    pytester.makepyfile(child=COMPUTING_CHILD, test_computing=COMPUTING_TEST)
    found = {}
    for source in ("sampled", "trace"):
        pytester.runpytest_subprocess(
            "--syncguard",
            f"--syncguard-timeline={source}",
            "--syncguard-json",
            f"{source}.json",
            "-p",
            "no:cacheprovider",
        )
        (found[source],) = json.loads((pytester.path / f"{source}.json").read_text())["tests"]
    elapsed_us = json.loads((pytester.path / "elapsed.json").read_text()) * 1000
    timeline = found["sampled"]["timeline"]
    assert found["sampled"]["verdict"] == "pass", found["sampled"]["checks"]
    # From the loop's first kernel to its last: the sampled span and the child's events agree (87.3 ms and 85.7 ms
    # on an H200); busy time is the span less the loop's own gaps.
    assert abs(timeline["span_us"] - elapsed_us) <= 0.1 * elapsed_us, (timeline["span_us"], elapsed_us)
    assert 0.5 * timeline["span_us"] <= timeline["busy_us"] <= timeline["span_us"], timeline
    check = next(c for c in found["trace"]["checks"] if c["budget"]["marker"] == "max_gpu_idle_us")
    assert (
        check["held"] is False
        and "unreliable: a trace records the GPU work of the test's process alone" in (check["text"])
    ), check
    assert "child.py)" in check["text"], check


HELD_COMPILE_CHILD = """
import sys
import torch


def held(gm, example_inputs):  # a backend that waits for the test: the compilation is in flight meanwhile
    print("compiling", flush=True)
    sys.stdin.readline()
    return gm.forward


@torch.compile(backend=held)
def layer(x):
    return x * 2 + 1


sys.stdin.readline()
layer(torch.ones(4))
print("done", flush=True)
sys.stdin.readline()
"""

HELD_COMPILE_TEST = """
import subprocess, sys
import pytest

@pytest.mark.max_recompiles(0)
def test_held(syncguard):
    child = subprocess.Popen([sys.executable, "child.py"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    with syncguard.generation(tokens=1):
        child.stdin.write("go\\n")
        child.stdin.flush()
        assert child.stdout.readline() == "compiling\\n"
    child.stdin.write("on\\n")
    child.stdin.flush()
    assert child.stdout.readline() == "done\\n"
    with syncguard.generation(tokens=1):  # the compilation ended before this region: not its
        pass
    child.communicate("end\\n", timeout=60)
"""


def test_a_compilation_a_child_is_still_in_at_the_regions_end_makes_its_compile_counts_not_measured(
    pytester: pytest.Pytester,
) -> None:
    """A child whose compilation started in the region and had not ended at its end (its backend waiting for the
    test) leaves the region's compile counters not measured, naming it, never a count without it; the region after,
    when it had ended, counts as ever (0 of its own)."""
    pytester.makepyfile(child=HELD_COMPILE_CHILD, test_held=HELD_COMPILE_TEST)
    pytester.runpytest_subprocess("--syncguard", "--syncguard-json", "r.json", "-p", "no:cacheprovider")
    (test,) = json.loads((pytester.path / "r.json").read_text())["tests"]
    check = next(c for c in test["checks"] if c["budget"]["marker"] == "max_recompiles")
    assert check["held"] is None and "was still compiling at the region's end" in check["text"], check
    assert "child process" in check["text"] and "child.py)" in check["text"], check
    assert "recompiles" not in test["metrics"]["values"], test["metrics"]["values"]
