#!/usr/bin/env bash
# Install pytest-syncguard (editable) with the given extras, e.g. `bash tools/install.sh test`.
# torch is installed only when missing, and then as the pinned 2.13.0: an unpinned requirement would pull the
# newest CUDA build (several GB) onto machines that already have the torch they want, or a CPU wheel at hand.
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-}"
if ! python -c "import torch" 2>/dev/null; then
    python -m pip install --quiet "torch==${SYNCGUARD_TORCH_VERSION:-2.13.0}"
fi
python -m pip install --quiet -e ".${extras:+[$extras]}"
