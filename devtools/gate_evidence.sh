#!/usr/bin/env bash
# Evidence for the gate on a CUDA machine (how docs/explanation/gate.md's numbers were made). Each step writes
# under OUT (default $OUT, else gate-evidence/):
#
#   bash devtools/gate_evidence.sh record BASELINES   the suite, its entries written (appended) to BASELINES
#   bash devtools/gate_evidence.sh judge BASELINES    the unchanged suite against BASELINES, and its report
#   bash devtools/gate_evidence.sh plant-record DIR   planted base (a 1-cycle spin per step): the speed tests of
#                                                     cuda_graph and static_compiled, recorded into DIR
#   bash devtools/gate_evidence.sh plant-judge DIR P  the same tests with P% of device time planted per step,
#                                                     against DIR
#   bash devtools/gate_evidence.sh plant-ab P SECONDS [STRATEGIES] [AB_OPTIONS...]
#                                                     syncguard ab of the planted base against P%, on the speed
#                                                     tests of STRATEGIES (a -k expression, default cuda_graph),
#                                                     within SECONDS
#   bash devtools/gate_evidence.sh plant-aa SECONDS [STRATEGIES] [AB_OPTIONS...]
#                                                     the same, of the planted base against a copy of itself
#   bash devtools/gate_evidence.sh plant-job P [STRATEGIES]
#                                                     the GPU job (ci/run_gpu_suite.sh) in its own mode on a pull
#                                                     request planting P% of this runner's own step (the base's
#                                                     speed tests run once first) in STRATEGIES (default
#                                                     cuda_graph; "cuda_graph static_compiled" for both), its base
#                                                     the planted base, in a git repository of this checkout
#                                                     without this GPU model's baseline file (the first pull
#                                                     request on a new GPU model): OUT/job-P/ and OUT/job-P.log
#   bash devtools/gate_evidence.sh history-push DIR N the planted base's speed tests run N times, each recorded into
#                                                     the history folder DIR as a push to main (push-K.json kept)
#   bash devtools/gate_evidence.sh history-judge DIR P [STRATEGY]
#                                                     the speed tests with P% planted in STRATEGY (default
#                                                     cuda_graph), judged against the history DIR
#
# A planted copy of the checkout is made under WORK (default OUT; devtools/plant_gpu_work.py); nothing here changes
# the checkout.
set -uo pipefail
cd "$(dirname "$0")/.."
out="$(realpath -m "${OUT:-gate-evidence}")"
work="$(realpath -m "${WORK:-$out}")"
mkdir -p "$out" "$work"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
plugin=(-p pytest_syncguard.plugin -p no:cacheprovider)
planted_tests=(examples/test_strategies.py -k "test_speed and (cuda_graph or static_compiled)")

planted_copy() {  # a copy of the checkout with PERCENT planted, in planted-NAME (default PERCENT): prints it
    local percent="$1" folder="$work/planted-${2:-$1}"
    rm -rf "$folder" && mkdir -p "$folder"
    cp -r pytest_syncguard examples baselines pyproject.toml "$folder"/
    # PLANT_ONLY (e.g. "cuda_graph static_compiled"): plant PERCENT in those strategies only, the base's one-cycle
    # spin in the others; PLANT_STEP (a results file of this runner): size the spin from its steps.
    local only=() name
    for name in ${PLANT_ONLY:-}; do only+=(--only "$name"); done
    python devtools/plant_gpu_work.py "$folder" --percent "$percent" "${only[@]}" \
        ${PLANT_STEP:+--step-results "$PLANT_STEP"} >&2 || exit 1
    echo "$folder"
}

case "${1:-}" in
record)
    python -m pytest "${plugin[@]}" examples --syncguard --syncguard-require-gpu --syncguard-baselines "$2" \
        --syncguard-update-baselines --syncguard-json "$out/record.json" -q
    ;;
judge)
    python -m pytest "${plugin[@]}" examples --syncguard --syncguard-require-gpu --syncguard-baselines "$2" \
        --syncguard-json "$out/judge.json" -q
    python -m pytest_syncguard.gate.cli report "$out/judge.json" --baselines "$2" --markdown "$out/judge.md"
    ;;
plant-record)
    folder="$(planted_copy 0)"
    baselines="$(realpath -m "$2")"
    (cd "$folder" && PYTHONPATH="$PWD" python -m pytest "${plugin[@]}" "${planted_tests[@]}" --syncguard \
        --syncguard-require-gpu --syncguard-baselines "$baselines" --syncguard-update-baselines -q)
    ;;
plant-judge)
    folder="$(planted_copy "$3")"
    baselines="$(realpath -m "$2")"
    (cd "$folder" && PYTHONPATH="$PWD" python -m pytest "${plugin[@]}" "${planted_tests[@]}" --syncguard \
        --syncguard-require-gpu --syncguard-baselines "$baselines" --syncguard-json "$out/plant-$3.json" -q)
    ;;
plant-ab | plant-aa)
    if [ "$1" = plant-ab ]; then percent="$2" && shift 2; else percent=0 && shift 1; fi
    seconds="$1" strategies="${2:-cuda_graph}"
    shift $(($# < 2 ? $# : 2))
    base="$(planted_copy 0)"
    head="$(planted_copy "$percent" "$percent-head")"
    (cd "$head" && PYTHONPATH="$PWD" python -m pytest_syncguard.gate.cli ab --base-dir "$(realpath "$base")" \
        --time-budget "$seconds" --out "$out/ab-$percent" --json "$out/ab-$percent.json" "$@" -- \
        -p pytest_syncguard.plugin examples/test_strategies.py -k "test_speed and ($strategies)")
    ;;
plant-job)
    percent="$2"
    base="$(planted_copy 0)"
    planted="${3:-cuda_graph}"
    (cd "$base" && PYTHONPATH="$PWD" python -m pytest "${plugin[@]}" examples/test_strategies.py \
        -k "test_speed and (${planted// / or })" --syncguard --syncguard-require-gpu \
        --syncguard-json "$out/job-$percent-step.json" -q > "$out/job-$percent-step.log" 2>&1)
    head="$(PLANT_ONLY="$planted" PLANT_STEP="$out/job-$percent-step.json" planted_copy "$percent" "$percent-job")"
    repo="$work/job-repo"
    rm -rf "$repo" "$out/job-$percent" && mkdir -p "$repo"
    cp -r pytest_syncguard examples baselines ci tools pyproject.toml "$repo"/
    slug="$(python -m pytest_syncguard.gate.cli device --json | python -c 'import json, sys; print(json.load(sys.stdin)["slug"])')"
    (
        cd "$repo" || exit 1
        rm -f "baselines/$slug.json"
        git init -q && git config user.email evidence@example.com && git config user.name evidence
        cp "$base/examples/strategies.py" examples/strategies.py && git add -A && git commit -qm "planted base"
        base_sha="$(git rev-parse HEAD)"
        cp "$head/examples/strategies.py" examples/strategies.py && git commit -qam "$percent% in $planted"
        SECONDS=0
        SYNCGUARD_INSTALL=true SYNCGUARD_TESTS="examples --durations=10" BASE_SHA="$base_sha" \
            bash ci/run_gpu_suite.sh "$out/job-$percent" > "$out/job-$percent.log" 2>&1
        echo "job exit $? in $SECONDS s" >> "$out/job-$percent.log"
    )
    ;;
history-push)
    # N pushes of the planted base's speed tests, each recorded into the history folder DIR as a run of main.
    folder="$(planted_copy 0)"
    history="$(realpath -m "$2")"
    for push in $(seq 1 "$3"); do
        (cd "$folder" && PYTHONPATH="$PWD" python -m pytest "${plugin[@]}" examples/test_strategies.py -k test_speed \
            --syncguard --syncguard-require-gpu --syncguard-json "$out/push-$push.json" -q) > "$out/push-$push.log" 2>&1
        python -m pytest_syncguard.gate.cli history record "$out/push-$push.json" --into "$history" \
            --commit "$(printf '%040x' "$(date +%s%N)")" || exit 1
    done
    ;;
history-judge)
    # The speed tests with P% of device time planted in STRATEGY (default cuda_graph) only, judged against DIR.
    folder="$(PLANT_ONLY="${4:-cuda_graph}" planted_copy "$3" "$3-history")"
    history="$(realpath -m "$2")"
    (cd "$folder" && PYTHONPATH="$PWD" python -m pytest "${plugin[@]}" examples/test_strategies.py -k test_speed \
        --syncguard --syncguard-require-gpu --syncguard-json "$out/pr-$3.json" -q) > "$out/pr-$3.log" 2>&1
    python -m pytest_syncguard.gate.cli report "$out/pr-$3.json" --history "$history" --markdown "$out/pr-$3.md"
    ;;
*)
    echo "usage: bash devtools/gate_evidence.sh record|judge|plant-record|plant-judge|plant-ab|plant-aa|plant-job|history-push|history-judge ..." >&2
    exit 2
    ;;
esac
