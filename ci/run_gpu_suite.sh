#!/usr/bin/env bash
# The GPU suite on a self-hosted runner: the tests under --syncguard (CUDA budgets required), compared with this
# GPU model's baseline file, with JUnit, JSON results, a Markdown report and the traces and allocator snapshots of
# failing tests, all under OUT (default syncguard-out/) for upload as one artifact. It runs in the working
# directory: this repository's (.github/workflows/gpu.yml), or another one's through the composite action
# .github/actions/syncguard, which sets the variables below from its inputs.
#
#   bash ci/run_gpu_suite.sh [OUT]
#
# SYNCGUARD_TESTS (default "examples"): the pytest arguments that select the suite. SYNCGUARD_BASELINES (default
# "baselines"): the baselines folder. SYNCGUARD_INSTALL (default: this checkout's tools/install.sh examples): the
# command that installs what the suite needs, run first. PR_NUMBER (optional) is written to OUT/pr-number for the
# comment workflow, which checks it again. BASE_SHA (optional, a pull request's base commit): the tests of
# SYNCGUARD_AB_TESTS (default: the strategy suite's speed tests) whose device time no baseline of this GPU model
# judged are also run A/B against the merge base on this runner (syncguard ab --skip-judged --no-host-timings: device
# time and counts, from each test's traced run, test by test until its verdict is settled, the suite's run of the
# head being the head's first round), within SYNCGUARD_AB_BUDGET seconds (default: what is left of
# SYNCGUARD_JOB_BUDGET, 600 s from the job's start, after the suite, less 30 s for the report). SYNCGUARD_AB_HOST_TIMINGS=true A/B-tests every one of them with its own timed runs, for
# its host timings too (not judged against a baseline recorded on another machine). SYNCGUARD_HISTORY (default true):
# judge against the default branch's history of this GPU model on origin's syncguard-history branch, where it has one
# (the push job records it: syncguard history record --push origin): the suite is judged against it too, so that
# pytest's summary and the report in one log say the same. SYNCGUARD_ACCEPT (default empty): why this change's
# regressions are intended (the action sets it from the pull request's accept label): reported as accepted, and the
# A/B's regressions do not fail the job. SYNCGUARD_REQUIRE_GPU (default true): false rehearses the
# job on a machine without a GPU (no CUDA device required; the CUDA budgets then say "not measured"; the A/B judges
# counts alone, with one warm pytest per side).
set -uo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
out="${1:-syncguard-out}"
mkdir -p "$out/artifacts"
# Each stage's end, in seconds since the job's start, to OUT/stages.txt (what the job's time went to).
: > "$out/stages.txt"
stage() { printf '%s\t%s\n' "$1" "$SECONDS" >> "$out/stages.txt"; }
# The pytest arguments are split as a shell would split them (-k "a or b" stays one argument), never evaluated.
split() { python3 -c 'import shlex, sys; print("\n".join(shlex.split(sys.argv[1])))' "$1"; }
mapfile -t tests < <(split "${SYNCGUARD_TESTS:-examples}") || exit 1
baselines="${SYNCGUARD_BASELINES:-baselines}"
mapfile -t ab_tests < <(split "${SYNCGUARD_AB_TESTS:-examples/test_strategies.py -k test_speed}") || exit 1

if [ -n "${SYNCGUARD_INSTALL:-}" ]; then
    bash -c "$SYNCGUARD_INSTALL" || exit 1
else
    bash "$here/tools/install.sh" examples || exit 1
fi
stage install
require_gpu=(--syncguard-require-gpu)
if [ "${SYNCGUARD_REQUIRE_GPU:-true}" = "false" ]; then
    require_gpu=()
    echo "SYNCGUARD_REQUIRE_GPU=false: a rehearsal, the CUDA budgets not measured where there is no GPU" >&2
else
    python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'no CUDA device visible on this runner')" \
        || exit 1
fi
# One look at the device (torch's import is most of it): its description kept in the artifact, its slug read from it.
syncguard device --json > "$out/device.json" || exit 1
slug="$(python -c 'import json, sys; print(json.load(open(sys.argv[1]))["slug"])' "$out/device.json")" || exit 1
printf '%s\n' "$slug" > "$out/device-slug"
if [[ "${PR_NUMBER:-}" =~ ^[0-9]+$ ]]; then
    printf '%s\n' "$PR_NUMBER" > "$out/pr-number"
fi

# The default branch's history of this GPU model (the push job records it on the syncguard-history branch) is the
# baseline where it has one, for the suite and the report alike; without it, the baselines folder judges.
history=()
reference="$baselines"
# SYNCGUARD_HISTORY_STORE (a postgresql:// connection string): the history in that database instead of the branch.
# SYNCGUARD_HISTORY_BRANCH (default syncguard-history): the branch, or a ref under refs/syncguard/ that a developer's
# git clone does not download (docs/howto/history.md).
history_from=(--branch "${SYNCGUARD_HISTORY_BRANCH:-syncguard-history}")
[ -z "${SYNCGUARD_HISTORY_STORE:-}" ] || history_from=(--store "$SYNCGUARD_HISTORY_STORE")
if [ "${SYNCGUARD_HISTORY:-true}" = "true" ] && { [ -n "${SYNCGUARD_HISTORY_STORE:-}" ] || git remote get-url origin > /dev/null 2>&1; }; then
    rm -rf "$out/history" "$out/reference"
    if syncguard history fetch --into "$out/history" "${history_from[@]}" && [ -f "$out/history/$slug.jsonl" ]; then
        history=(--history "$out/history")
        syncguard history baselines "$out/history" --out "$out/reference" > /dev/null && reference="$out/reference"
    fi
fi
stage history
if [ ! -f "$reference/$slug.json" ]; then
    echo "no $baselines/$slug.json and no history of $slug: every test is reported as new; record it with" \
        "pytest ${tests[*]} --syncguard --syncguard-baselines=$baselines --syncguard-update-baselines" >&2
fi

# One xdist worker per GPU when the runner has several (each worker takes its own GPU).
gpus="$(nvidia-smi -L 2>/dev/null | wc -l)"
workers=()
if [ "${gpus:-0}" -gt 1 ]; then
    workers=(-n "$gpus")
fi

# Each option with its value in one argument: pytest reads its rootdir before it knows a plugin's options, so a value
# given apart would be taken for a test path (in a repository without a pytest configuration, the rootdir moves).
python -m pytest "${tests[@]}" -p no:cacheprovider "${workers[@]}" \
    --syncguard "${require_gpu[@]}" --syncguard-baselines="$reference" \
    --junitxml="$out/junit-$slug.xml" --syncguard-json="$out/results-$slug.json" \
    --syncguard-artifacts="$out/artifacts"
status=$?
stage suite

ab=()
if [[ "${BASE_SHA:-}" =~ ^[0-9a-f]{40}$ ]]; then
    merge_base="$(git merge-base "$BASE_SHA" HEAD)" || exit 1
    # The suite is judged against the merge base's baselines: a pull request cannot loosen its own gate.
    ab=(--base-ref "$merge_base")
    # Device time, all the A/B judges here, comes from each measure()'s traced run: in the rounds after the first,
    # that run alone (the rounds make the interval). Host timings need the tests' own timed runs.
    judged=(--no-host-timings --timed-runs 0)
    # A rehearsal without a GPU has no device time to judge, only counts (exact): one warm pytest per side does it
    # (the second pair exists to cancel one process's offset in a timing).
    if [ "${#require_gpu[@]}" -eq 0 ]; then
        judged+=(--processes 1)
    fi
    if [ "${SYNCGUARD_AB_HOST_TIMINGS:-false}" = "true" ]; then
        judged=()
    elif [ -f "$out/results-$slug.json" ]; then
        # The suite measured the head on this runner: its results are the head's first round, not run again.
        judged+=(--skip-judged "$out/results-$slug.json" --head-results "$out/results-$slug.json")
    fi
    budget="${SYNCGUARD_AB_BUDGET:-$(( ${SYNCGUARD_JOB_BUDGET:-600} - SECONDS - 30 ))}"
    [ "$budget" -ge 60 ] || budget=60
    # A change accepted as intended (SYNCGUARD_ACCEPT) is A/B-tested and reported; its regressions fail nothing.
    fail_on=(--fail-on-regression)
    [ -z "${SYNCGUARD_ACCEPT:-}" ] || fail_on=()
    syncguard ab --base "$merge_base" --time-budget "$budget" --out "$out/ab" "${judged[@]}" \
        --json "$out/ab-$slug.json" --markdown "$out/ab-$slug.md" "${fail_on[@]}" -- "${ab_tests[@]}" \
        || status=1
    # An A/B that could not run wrote no report: the comment says so (its log is in the artifact), and is posted.
    if [ -f "$out/ab-$slug.json" ]; then
        ab+=(--ab "$out/ab-$slug.json")
    else
        echo "syncguard ab wrote no report (see its log in $out/ab): the comment goes without it" >&2
    fi
    stage ab
fi


# Sites link to their lines at the commit measured, where the repository is known (GitHub Actions and GitLab CI set
# it; inside a GitLab job, syncguard links to its server, CI_SERVER_URL).
links=()
commit="$(git rev-parse HEAD 2>/dev/null)"
repository="${GITHUB_REPOSITORY:-${CI_PROJECT_PATH:-}}"
if [ -n "$repository" ] && [ -n "$commit" ]; then
    links=(--repository "$repository" --commit "$commit")
fi
accept=()
[ -z "${SYNCGUARD_ACCEPT:-}" ] || accept=(--accept "$SYNCGUARD_ACCEPT")
syncguard report "$out/results-$slug.json" --baselines "$baselines" "${history[@]}" "${ab[@]}" "${links[@]}" \
    "${accept[@]}" --markdown "$out/report-$slug.md" --json "$out/report-$slug.json" || status=1
stage report
# The report in the job's log: its verdict, the failed budgets and each regression's chain, then the rest.
cat "$out/report-$slug.md" 2>/dev/null
exit "$status"
