#!/usr/bin/env bash
# Evidence that a test's counts and allocator numbers do not depend on the tests before it in its process, on a
# CUDA machine (how docs/explanation/gate.md's "Counts, allocator numbers and the order of tests" was made). Each
# step writes results documents (--syncguard-json) and logs under OUT (default $OUT, else order-evidence/):
#
#   bash devtools/order_evidence.sh orders            the strategy suite in order on GPU 0 and reversed on GPU 1,
#                                                     at once (forward.json, reverse.json); needs two GPUs
#   bash devtools/order_evidence.sh split BASELINES   against BASELINES: -n N for each N in $WORKERS (default
#                                                     "2 4") on every visible GPU (nN.json), then one test
#                                                     under -k (alone.json)
#   bash devtools/order_evidence.sh serial BASELINES  the suite in order against BASELINES (serial.json)
#   bash devtools/order_evidence.sh share             what sharing a GPU does: -n 2 with both workers on GPU 0
#                                                     (shared.json), then one worker per GPU (apart.json); the
#                                                     first judged against the second, host timings included
#                                                     (share.md, share-verdicts.json)
#
# Compare the documents with `syncguard report DOC --baselines BASELINES --fail-on-regression`.
set -uo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
orders | split | serial) ;;
esac
if [[ ! "${1:-}" =~ ^(orders|split|serial|share)$ ]]; then
    sed -n '2,16p' "$0" >&2
    exit 2
fi
out="$(realpath -m "${OUT:-order-evidence}")"
mkdir -p "$out"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
suite=(python -m pytest -p pytest_syncguard.plugin -p no:cacheprovider examples --syncguard --syncguard-require-gpu -q)
#: The test whose kept state (static cache, compiled step) the test before it in the suite could reuse.
alone="test_timeline and static_compiled"

case "${1:-}" in
orders)
    CUDA_VISIBLE_DEVICES=0 "${suite[@]}" --syncguard-json "$out/forward.json" >"$out/forward.log" 2>&1 &
    CUDA_VISIBLE_DEVICES=1 "${suite[@]}" -p devtools.reversed_order --syncguard-json "$out/reverse.json" \
        >"$out/reverse.log" 2>&1 &
    wait
    tail -n 4 "$out/forward.log" "$out/reverse.log"
    ;;
split)
    for workers in ${WORKERS:-2 4}; do
        "${suite[@]}" -n "$workers" --syncguard-baselines "$2" --syncguard-json "$out/n$workers.json" \
            >"$out/n$workers.log" 2>&1
        tail -n 4 "$out/n$workers.log"
    done
    "${suite[@]}" -k "$alone" --syncguard-baselines "$2" --syncguard-json "$out/alone.json" >"$out/alone.log" 2>&1
    tail -n 4 "$out/alone.log"
    ;;
share)
    CUDA_VISIBLE_DEVICES=0 "${suite[@]}" -n 2 --syncguard-json "$out/shared.json" >"$out/shared.log" 2>&1
    "${suite[@]}" -n 2 --syncguard-json "$out/apart.json" >"$out/apart.log" 2>&1
    tail -n 3 "$out/shared.log" "$out/apart.log"
    rm -rf "$out/apart-baselines" && mkdir "$out/apart-baselines"
    python -m pytest_syncguard.gate.cli baselines --record "$out/apart.json" -- "$out/apart-baselines"
    python -m pytest_syncguard.gate.cli report "$out/shared.json" --baselines "$out/apart-baselines" --judge-host-timings \
        --markdown "$out/share.md" --json "$out/share-verdicts.json"
    ;;
serial)
    "${suite[@]}" --syncguard-baselines "$2" --syncguard-json "$out/serial.json" >"$out/serial.log" 2>&1
    tail -n 6 "$out/serial.log"
    ;;
esac
