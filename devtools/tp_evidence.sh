#!/usr/bin/env bash
# Evidence for one verdict over the ranks of a launch (docs/howto/torchrun.md), on a machine with 2 GPUs: the
# tensor-parallel example under torchrun, its two ranks' documents joined by syncguard report. Writes under OUT
# (default $OUT, else tp-evidence/):
#
#   record/     an unchanged run, recorded as the baseline keyed by GPU model x 2 (baselines/)
#   unchanged/  a second unchanged run, judged against it (and unchanged2/, a third)
#   straggler/  rank 1 spinning SYNCGUARD_PLANT_STRAGGLER_US (default 200) us of GPU work in each step
#   killed/     rank 1 killed (SIGKILL) in the middle of its first measured run
#
# Each folder has the ranks' documents, the report (report.json, comment.md) and the launch's log.
set -uo pipefail
cd "$(dirname "$0")/.."
out="$(realpath -m "${OUT:-tp-evidence}")"
mkdir -p "$out"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
plugin=(-p pytest_syncguard.plugin -p no:cacheprovider)

launch() {  # NAME [ENV=VALUE...]: the example under torchrun, then its report against out/baselines
    local name="$1"; shift
    mkdir -p "$out/$name"
    ( cd "$out/$name" && env "$@" timeout 300 python3 -m torch.distributed.run --standalone --nproc-per-node 2 \
        -m pytest -q "${plugin[@]}" --rootdir "$OLDPWD" "$OLDPWD/examples/test_tensor_parallel.py" --syncguard \
        --syncguard-json r.json > launch.log 2>&1; echo "torchrun exit $?" >> launch.log )
    local judged=()
    [ -d "$out/baselines" ] && judged=(--baselines "$out/baselines")
    python3 -m pytest_syncguard.gate.cli report "$out/$name"/r.rank*.json "${judged[@]}" --json "$out/$name/report.json" \
        --markdown "$out/$name/comment.md" --fail-on-regression > "$out/$name/report.log" 2>&1
    echo "$name: report exit $? $(tail -1 "$out/$name/report.log")"
}

launch record
python3 -m pytest_syncguard.gate.cli baselines "$out/baselines" --record "$out/record"/r.rank*.json
launch unchanged
launch unchanged2
launch straggler SYNCGUARD_PLANT_STRAGGLER_US="${SYNCGUARD_PLANT_STRAGGLER_US:-200}"
launch killed SYNCGUARD_PLANT_KILL_RANK=1
