#!/usr/bin/env bash
# Install pytest-syncguard (editable) with the given extras, e.g. `bash tools/install.sh test`.
# torch is installed only when missing, and then as the pinned 2.13.0: an unpinned requirement would pull the
# newest CUDA build (several GB) onto machines that already have the torch they want, or a CPU wheel at hand.
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-}"
# What it is doing, on stderr: each step takes from seconds to a minute, and --quiet says nothing meanwhile.
say() { echo "tools/install.sh: $*" >&2; }
if ! python -c "import torch" 2>/dev/null; then
    say "installing torch ${SYNCGUARD_TORCH_VERSION:-2.13.0} (none is importable)"
    python -m pip install --quiet "torch==${SYNCGUARD_TORCH_VERSION:-2.13.0}"
fi
say "installing pytest-syncguard${extras:+[$extras]} (editable) and its dependencies"
python -m pip install --quiet -e ".${extras:+[$extras]}"
say "done: $(python -c 'import torch, pytest_syncguard.version as v; print(f"pytest-syncguard {v.__version__}, torch {torch.__version__}")')"
