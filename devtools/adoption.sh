#!/usr/bin/env bash
# The action adopted by a scratch repository of its own, as another project would: a decode-loop test, the README's
# workflow snippet as its .github/workflows/gpu.yml, and an origin (a bare repository). Then, through
# devtools/run_action.py: two pushes to main (each records its run into origin's syncguard-history branch), and a
# pull request that adds a host read per step (judged against that history, A/B-tested against its merge base). On
# a GPU runner with pytest-syncguard and its `syncguard` command installed. Everything goes under OUT (default
# adoption/): the scratch repository, each job's log and output folder.
#
#   bash devtools/adoption.sh [OUT]
set -uo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
out="$(realpath -m "${1:-adoption}")"
rm -rf "$out" && mkdir -p "$out"
repo="$out/scratch" origin="$out/origin.git"
git init -q --bare -b main "$origin"
git init -q -b main "$repo"
cd "$repo" || exit 1
git config user.email scratch@example.com && git config user.name scratch
git remote add origin "$origin"
mkdir -p tests .github/workflows
cat > tests/test_decode.py <<'PY'
import pytest
import torch

CHECK_EVERY_STEP = False


def decode(model, prompt, steps):
    tokens = prompt
    for _ in range(steps):
        next_token = model(tokens[:, -1:])[:, -1].argmax(-1, keepdim=True)
        tokens = torch.cat([tokens, next_token], dim=1)
        if CHECK_EVERY_STEP and bool((next_token == 0).all()):  # the host reads the device
            break
    return tokens


@pytest.mark.max_syncs_per_token(0)
def test_greedy_decode(syncguard):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(64, 512), torch.nn.Linear(512, 64)).cuda()
    prompt = torch.randint(1, 64, (8, 8), device="cuda")
    with torch.inference_mode(), syncguard.generation(model=model):
        decode(model, prompt, steps=32)
PY
# The README's snippet, as it is written there.
python3 - "$here/README.md" > .github/workflows/gpu.yml <<'PY'
import re, sys
text = open(sys.argv[1]).read().split("## In another repository's CI", 1)[1]
print(re.search(r"```yaml\n(.*?)```", text, re.S).group(1), end="")
PY
git add -A && git commit -qm "a decode loop under syncguard" && git push -q origin main
# Posting needs GitHub; the scratch project is tests only, on a runner that has torch.
action=(python3 "$here/devtools/run_action.py" .github/workflows/gpu.yml --set comment=false --set ab-budget=150
    --set install=true)
for push in 1 2; do
    [ "$push" = 2 ] && git commit -q --allow-empty -m "push $push" && git push -q origin main
    SECONDS=0
    "${action[@]}" --event push --token local --set output="$out/push-$push" > "$out/push-$push.log" 2>&1
    echo "push $push: exit $? in $SECONDS s; $(tail -n 1 "$out/push-$push.log")"
done
base="$(git rev-parse HEAD)"
git checkout -q -b check-every-step
sed -i 's/^CHECK_EVERY_STEP = False/CHECK_EVERY_STEP = True/' tests/test_decode.py
git commit -qam "stop at the end token" 
SECONDS=0
"${action[@]}" --event pull_request --pr 1 --base "$base" --set output="$out/pr" > "$out/pr.log" 2>&1
echo "pull request: exit $? in $SECONDS s"
git --git-dir "$origin" log --oneline syncguard-history
