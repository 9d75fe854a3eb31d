"""The plugin as users meet it: markers, options, the fixture and their error paths (pytester runs)."""

from __future__ import annotations

import json

import pytest

LOOP = """
import pytest, torch

def loop(steps, reads_per_step):
    x = torch.ones(4)
    for _ in range(steps):
        x = x * 1.0
        for _ in range(reads_per_step):
            x.sum().item()
"""


def test_markers_are_documented(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--markers")
    result.stdout.fnmatch_lines(
        [
            "@pytest.mark.max_syncs_per_token(limit: float): Fail when host-device syncs divided by tokens*",
            "@pytest.mark.max_syncs(limit: float): Fail when the total of host-device syncs*",
            "@pytest.mark.max_gpu_idle_us(limit: float, [*], stat: str = 'max'): Fail when the GPU's idle gaps*",
            "@pytest.mark.min_gpu_busy(fraction: float): Fail when GPU busy time*",
            "@pytest.mark.max_fragmentation(limit: float): Fail when 1 - allocated_peak / reserved_peak*",
            "@pytest.mark.max_reserved_mb(limit: float): Fail when the CUDA caching allocator's reserved peak*",
            "@pytest.mark.syncguard([*], device: str | None = None, warmup: int = 1, warmup_steps: int = 2, "
            "tolerance: float | None = None, baseline: bool = True): Per-test*",
        ]
    )


def test_per_token_budget_failure_shows_arithmetic_and_sites(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        LOOP
        + """
@pytest.mark.max_syncs_per_token(1)
def test_two_reads(syncguard):
    with syncguard.generation(tokens=4):
        loop(4, 2)

@pytest.mark.max_syncs_per_token(2)
def test_within(syncguard):
    with syncguard.generation(tokens=4):
        loop(4, 2)
"""
    )
    result = pytester.runpytest()
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(
        [
            "syncguard: 1 of 1 budgets exceeded on cpu",
            "  max_syncs_per_token: limit 1.00 per token, measured 2.00: 8 syncs over 4 tokens",
            "sync sites (8 syncs, by kind and call site, most frequent first):",
            "      8 x scalar read (aten::_local_scalar_dense) at test_per_token_budget_failure_shows_arithmetic_and_sites.py:8 in loop: *",
            "          test_per_token_budget_failure_shows_arithmetic_and_sites.py:13 in test_two_reads",
            "not visible on cpu: host<->device copy, non_blocking copy with pageable memory, *",
        ]
    )


def test_whole_test_is_measured_without_a_region(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
import pytest, torch

@pytest.mark.max_syncs(1)
def test_masks():
    x = torch.arange(10.0)
    x[x > 3]
    torch.unique(x)
"""
    )
    result = pytester.runpytest()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "  max_syncs: limit 1, measured 2 syncs",
            "      1 x data-dependent shape (aten::nonzero) at *:6 in test_masks: x[[]x > 3[]]",
            "      1 x data-dependent shape (aten::_unique2) at *:7 in test_masks: torch.unique(x)",
        ]
    )


@pytest.mark.parametrize(
    ("marker", "message"),
    [
        ("max_syncs_per_token(-1)", "limit must be a finite number >= 0, got -1"),
        ("max_syncs_per_token(float('nan'))", "limit must be a finite number >= 0, got nan"),
        ("max_syncs(float('inf'))", "limit must be a finite number >= 0, got inf"),
        ("max_syncs(True)", "limit must be a finite number >= 0, got True"),
        ("max_syncs('1')", "limit must be a finite number >= 0, got '1'"),
        ("max_syncs_per_token(1, per='step')", "got an unexpected keyword argument 'per'"),
        ("max_syncs()", "missing a required argument: 'limit'"),
        ("max_syncs(1, 2)", "too many positional arguments"),
        ("syncguard(device='tpu')", "device must be 'cpu' or 'cuda', got 'tpu'"),
        ("syncguard(warmup=-2)", "warmup must be an int >= 0, got -2"),
        ("syncguard(tolerence=0.1)", "got an unexpected keyword argument 'tolerence'"),
        ("syncguard(tolerance=-0.1)", "tolerance must be a finite number >= 0, got -0.1"),
        ("syncguard(tolerance=float('nan'))", "tolerance must be a finite number >= 0, got nan"),
        ("syncguard(tolerance='10%')", "tolerance must be a number >= 0, got '10%'"),
        ("syncguard(baseline='no')", "baseline must be True or False, got 'no'"),
    ],
)
def test_bad_marker_arguments_are_usage_errors_naming_test_and_marker(
    pytester: pytest.Pytester, marker: str, message: str
) -> None:
    pytester.makepyfile(
        f"""
import pytest

@pytest.mark.{marker}
def test_budgeted():
    pass

def test_other():
    pass
"""
    )
    result = pytester.runpytest()
    result.assert_outcomes(passed=1, errors=1)
    name = marker.partition("(")[0]
    result.stdout.fnmatch_lines([f"*syncguard usage error: *::test_budgeted: @pytest.mark.{name}*{message}*"])
    result.stdout.no_fnmatch_line("*During handling*")


def test_per_token_budget_without_tokens_is_a_usage_error(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        LOOP
        + """
@pytest.mark.max_syncs_per_token(5)
def test_no_count():
    loop(2, 1)
"""
    )
    result = pytester.runpytest()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*test_no_count: @pytest.mark.max_syncs_per_token needs a token count: pass tokens=*"])


def test_tokens_set_later_or_counted_from_model_calls(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        LOOP
        + """
@pytest.mark.max_syncs_per_token(1)
def test_set_later(syncguard):
    with syncguard.generation() as region:
        loop(3, 1)
        region.tokens = 3
    assert syncguard.last.tokens == 3 and syncguard.last.syncs_per_token == 1.0

@pytest.mark.max_syncs_per_token(1)
def test_model_calls(syncguard):
    model = torch.nn.Linear(4, 4)
    with torch.no_grad(), syncguard.generation(model=model):
        x = torch.ones(1, 4)
        for _ in range(5):
            x = model(x)
            x.sum().item()
    assert syncguard.last.tokens == 5 and syncguard.last.syncs == 5

def test_bad_tokens(syncguard):
    with pytest.raises(Exception, match="tokens must be a positive int, got 0"):
        with syncguard.generation(tokens=0):
            pass
"""
    )
    pytester.runpytest().assert_outcomes(passed=3)


def test_allowed_syncs_are_reported_not_counted(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        LOOP
        + """
@pytest.mark.max_syncs(0)
def test_decode_at_end(syncguard):
    with syncguard.generation(tokens=4):
        x = torch.ones(4)
        with syncguard.allow():
            x.tolist(), x.sum().item()
    assert syncguard.last.syncs == 0 and syncguard.last.allowed_syncs == 1
"""
    )
    pytester.runpytest().assert_outcomes(passed=1)


def test_measure_runs_warmup_then_keeps_the_worst_repeat(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        LOOP
        + """
calls = []

@pytest.mark.max_syncs_per_token(1)
def test_measured(syncguard):
    def run():
        calls.append(1)
        loop(4, 2 if len(calls) == 3 else 1)
    m = syncguard.measure(run, tokens=4, warmup=1, repeat=3)
    assert len(calls) == 4
    assert m.syncs == 8 and syncguard.last is m
"""
    )
    result = pytester.runpytest()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*measured 2.00: 8 syncs over 4 tokens"])


def test_timings_only_runs_the_timed_runs_and_checks_no_count_budget(pytester: pytest.Pytester) -> None:
    """What syncguard ab's rounds after the first run: a count budget (judged in the round that counted) is not
    checked; the traced run (device time) and the timed runs are made as in a full run, or as many timed runs as
    --syncguard-repeat says."""
    pytester.makepyfile(
        LOOP
        + """
calls = []

@pytest.mark.max_syncs_per_token(1)
def test_measured(syncguard):
    def run():
        calls.append(1)
        loop(4, 2)
    m = syncguard.measure(run, tokens=4, warmup=1, repeat=3)
    print(f"CALLS={len(calls)} TIMED={len(m.timings)}")
"""
    )
    full = pytester.runpytest("--syncguard", "-s")
    full.assert_outcomes(failed=1)  # 2 syncs per token against a budget of 1
    full.stdout.fnmatch_lines(["*CALLS=5 TIMED=3*"])  # a warm-up, the counting run, 3 timed runs
    timed = pytester.runpytest("--syncguard", "--syncguard-timings-only", "-s")
    timed.assert_outcomes(passed=1)
    timed.stdout.fnmatch_lines(["*CALLS=5 TIMED=3*"])
    fewer = pytester.runpytest("--syncguard", "--syncguard-timings-only", "--syncguard-repeat", "1", "-s")
    fewer.assert_outcomes(passed=1)
    fewer.stdout.fnmatch_lines(["*CALLS=3 TIMED=1*"])  # the warm-up, the traced run, one timed run
    traced = pytester.runpytest("--syncguard", "--syncguard-timings-only", "--syncguard-repeat", "0", "-s")
    traced.assert_outcomes(passed=1)
    traced.stdout.fnmatch_lines(["*CALLS=2 TIMED=0*"])  # the warm-up and the traced run: device time only
    refused = pytester.runpytest("--syncguard", "--syncguard-repeat", "-1")
    assert refused.ret == pytest.ExitCode.USAGE_ERROR
    refused.stderr.fnmatch_lines(["*--syncguard-repeat -1: not a number of timed runs (0 or more)*"])


def test_several_regions_add_up(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        LOOP
        + """
@pytest.mark.max_syncs_per_token(1)
def test_two(syncguard):
    with syncguard.generation(tokens=2):
        loop(2, 1)
    loop(5, 1)  # outside the regions: not counted
    with syncguard.generation(tokens=2):
        loop(2, 2)
"""
    )
    result = pytester.runpytest()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*measured 1.50: 6 syncs over 4 tokens"])


def test_more_than_ten_sites_are_summarised(pytester: pytest.Pytester) -> None:
    body = "\n".join(f"        x[{i}].item()" for i in range(13))
    pytester.makepyfile(
        f"""
import pytest, torch

@pytest.mark.max_syncs(0)
def test_many(syncguard):
    x = torch.ones(13)
    with syncguard.generation(tokens=1):
{body}
"""
    )
    result = pytester.runpytest()
    result.stdout.fnmatch_lines(["  ... and 3 more sites (3 syncs)"])


def test_own_failure_keeps_its_message_and_gains_a_section(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        LOOP
        + """
@pytest.mark.max_syncs(0)
def test_broken():
    loop(1, 1)
    assert 1 == 2, "own assertion"
"""
    )
    result = pytester.runpytest()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        ["*AssertionError: own assertion*", "*- syncguard -*", "*max_syncs: limit 0, measured 1 sync"]
    )


def test_summary_table_and_json_results(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        LOOP
        + """
@pytest.mark.max_syncs_per_token(1)
def test_a(syncguard):
    with syncguard.generation(tokens=4):
        loop(4, 1)

def test_b(syncguard):
    with syncguard.generation(tokens=2):
        loop(2, 3)

def test_unmeasured():
    loop(1, 1)
"""
    )
    result = pytester.runpytest("--syncguard", "--syncguard-json", "out/results.json")
    result.assert_outcomes(passed=3)
    result.stdout.fnmatch_lines(
        [
            "*= syncguard summary =*",
            "test * device  tokens  syncs  syncs/token  ops/token  median ms  tokens/s  budget * baseline  verdict",
            "*::test_a  cpu  * 4  * 4  * 1.00  * max_syncs_per_token<=1  new * PASS",
            "*::test_b  cpu  * 2  * 6  * 3.00  * -  * new * MEASURED",
            "cpu rows count scalar reads and data-dependent shapes*",
        ]
    )
    result.stdout.no_fnmatch_line("*test_unmeasured*")
    document = json.loads((pytester.path / "out" / "results.json").read_text())
    assert document["schema"] == "pytest-syncguard/results" and document["schema_version"] == 2
    tests = {t["nodeid"].split("::")[1]: t for t in document["tests"]}
    assert sorted(tests) == ["test_a", "test_b"]
    assert tests["test_a"]["syncs"] == 4 and tests["test_a"]["verdict"] == "pass"
    assert tests["test_b"]["by_kind"] == {"scalar read": 6}
    assert tests["test_b"]["sites"][0]["count"] == 6


def test_budgets_hold_without_the_option_and_the_ini_enables_the_summary(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        LOOP
        + """
@pytest.mark.max_syncs(0)
def test_one():
    loop(1, 1)
"""
    )
    quiet = pytester.runpytest()
    quiet.assert_outcomes(failed=1)
    quiet.stdout.no_fnmatch_line("*syncguard summary*")
    pytester.makeini("[pytest]\nsyncguard = true\n")
    pytester.runpytest().stdout.fnmatch_lines(["*= syncguard summary =*"])


def test_summary_is_merged_from_xdist_workers(pytester: pytest.Pytester) -> None:
    pytest.importorskip("xdist")
    tests = "\n".join(
        f"""
@pytest.mark.max_syncs_per_token(1)
def test_{i}(syncguard):
    with syncguard.generation(tokens=2):
        loop(2, {1 + i % 2})
"""
        for i in range(4)
    )
    pytester.makepyfile(LOOP + tests)
    result = pytester.runpytest("-n", "2", "--syncguard", "--syncguard-json", "r.json")
    result.assert_outcomes(passed=2, failed=2)
    result.stdout.fnmatch_lines(["*limit 1.00 per token, measured 2.00: 4 syncs over 2 tokens"])
    document = json.loads((pytester.path / "r.json").read_text())
    assert [t["syncs"] for t in document["tests"]] == [2, 4, 2, 4]


GPU_BUDGETS = """
import pytest
import torch

@pytest.mark.max_gpu_idle_us(50, stat="p99")
@pytest.mark.min_gpu_busy(0.8)
@pytest.mark.max_fragmentation(0.2)
@pytest.mark.max_reserved_mb(100)
@pytest.mark.max_syncs(5)
def test_loop(syncguard):
    with syncguard.generation(tokens=4):
        for _ in range(4):
            torch.ones(3).sum().item()
"""


def test_gpu_budgets_on_cpu_are_not_measured_never_passed(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(GPU_BUDGETS)
    result = pytester.runpytest("--syncguard", "--syncguard-json=out.json")
    result.assert_outcomes(passed=1)
    # The one budget a CPU measures held; the verdict says the other four were not measured.
    result.stdout.fnmatch_lines(["*test_loop*cpu*4*4*1.00*max_gpu_idle_us(p99)<=50 +3 more*PASS (4 not measured)"])
    data = json.loads((pytester.path / "out.json").read_text())
    (test,) = data["tests"]
    outcomes = {c["budget"]["marker"]: c["held"] for c in test["checks"]}
    assert outcomes == {
        "max_syncs": True, "max_gpu_idle_us": None, "min_gpu_busy": None,
        "max_fragmentation": None, "max_reserved_mb": None,
    }  # fmt: skip
    assert test["verdict"] == "not measured"


def test_require_gpu_fails_gpu_budgets_on_cpu(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(GPU_BUDGETS)
    result = pytester.runpytest("--syncguard-require-gpu")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "*4 of 5 budgets exceeded on cpu*",
            "*max_gpu_idle_us: not measured: needs CUDA; ran on cpu (--syncguard-require-gpu)*",
            "*max_reserved_mb: not measured: needs CUDA; ran on cpu (--syncguard-require-gpu)*",
        ]
    )


@pytest.mark.parametrize(
    ("marker", "message"),
    [
        ("max_gpu_idle_us(-1)", "limit must be a finite number >= 0, got -1"),
        ("max_gpu_idle_us(10, stat='p0')", "stat must be 'max', 'mean' or a percentile such as 'p99', got 'p0'"),
        ("max_gpu_idle_us(10, stat=99)", "stat must be 'max', 'mean' or a percentile such as 'p99', got 99"),
        ("max_gpu_idle_us(10, 'p99')", "too many positional arguments"),
        ("min_gpu_busy(1.5)", "limit is a fraction in [[]0, 1], got 1.5"),
        ("min_gpu_busy(True)", "got True"),
        ("max_fragmentation('0.2')", "got '0.2'"),
        ("max_fragmentation(float('nan'))", "got nan"),
        ("max_reserved_mb(limit=1, unit='GB')", "unexpected keyword argument 'unit'"),
        ("syncguard(warmup_steps=-1)", "warmup_steps must be an int >= 0, got -1"),
    ],
)
def test_bad_gpu_budget_arguments_are_usage_errors(pytester: pytest.Pytester, marker: str, message: str) -> None:
    pytester.makepyfile(
        f"""
        import pytest

        @pytest.mark.{marker}
        def test_it():
            pass
        """
    )
    result = pytester.runpytest()
    result.assert_outcomes(errors=1)
    name = marker.split("(")[0]
    result.stdout.fnmatch_lines([f"*syncguard usage error: test_*.py::test_it: @pytest.mark.{name}*{message}*"])


def test_an_exceeded_budget_is_the_failure_an_xfail_mark_expects(pytester: pytest.Pytester) -> None:
    """An xfail mark plus an exceeded budget was reported FAILED (the plugin rewrote the report): it is XFAIL, strict
    or not, with the budget's text in its report; an xfail test whose budget holds still XPASSes."""
    pytester.makepyfile(
        LOOP
        + """
@pytest.mark.xfail(reason="known host read")
@pytest.mark.max_syncs(0)
def test_expected(syncguard):
    with syncguard.generation(tokens=1):
        loop(1, 1)


@pytest.mark.xfail(reason="known host read", strict=True)
@pytest.mark.max_syncs(0)
def test_expected_strictly(syncguard):
    with syncguard.generation(tokens=1):
        loop(1, 1)


@pytest.mark.xfail(reason="not this one")
@pytest.mark.max_syncs(5)
def test_held(syncguard):
    with syncguard.generation(tokens=1):
        loop(1, 1)


@pytest.mark.max_syncs(0)
def test_plain(syncguard):
    with syncguard.generation(tokens=1):
        loop(1, 1)
"""
    )
    result = pytester.runpytest("-rxX", "--syncguard-json=results.json")
    result.assert_outcomes(xfailed=2, xpassed=1, failed=1)
    result.stdout.fnmatch_lines(["XFAIL *::test_expected - syncguard budget failed: known host read"])
    result.stdout.fnmatch_lines(["XFAIL *::test_expected_strictly - syncguard budget failed: known host read"])
    # The results say so, and the run's verdict fails on test_plain alone (two XFAILs read as failed budgets).
    from pytest_syncguard.document import file as results_file
    from pytest_syncguard.judge.run import compare_run

    tests = {t.nodeid.split("::")[1]: t for t in results_file.read(pytester.path / "results.json")}
    assert tests["test_expected"].expected_failure == "syncguard budget failed: known host read"
    assert tests["test_plain"].expected_failure is None and tests["test_held"].expected_failure is None
    from pytest_syncguard.judge.verdict import Verdict

    verdict = Verdict.of(compare_run([pytester.path / "results.json"], None))
    assert [key[1].split("::")[1] for key in verdict.failing] == ["test_plain"]


def test_a_misspelt_budget_marker_fails_the_test_naming_the_closest_one(pytester: pytest.Pytester) -> None:
    """``max_sync_per_token`` would leave the loop without a budget, with only pytest's warning: it fails the test,
    naming the marker meant. A marker of the user's own, registered or not near ours, is left alone."""
    pytester.makeini("[pytest]\nmarkers =\n    max_seq_len(n): the user's own\n")
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.max_sync_per_token(0)
        def test_typo(syncguard):
            pass

        @pytest.mark.max_seq_len(8)
        @pytest.mark.slow
        def test_own_markers():
            pass
        """
    )
    done = pytester.runpytest("-p", "no:cacheprovider")
    done.assert_outcomes(passed=1, errors=1)
    done.stdout.fnmatch_lines(["*test_typo*@pytest.mark.max_sync_per_token is no marker of pytest-syncguard: did you "
                               "mean @pytest.mark.max_syncs_per_token? As written, no budget is enforced*"])  # fmt: skip
