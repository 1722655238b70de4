#!/usr/bin/env bash
# Create or update the project virtualenv (.venv) with the pinned stack. Idempotent: when nothing
# changed since the last successful run it only checks the imports (a few seconds).
#
# Environment knobs: VENV (default .venv), PYTHON (default python3.11, else python3 if it is 3.11),
# VIT_PLUGIN_CACHE (default ~/.cache/vit_plugin; holds the built mmcv wheel).
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${VENV:-.venv}
CACHE=${VIT_PLUGIN_CACHE:-$HOME/.cache/vit_plugin}
MMCV_VERSION=2.1.0
LOCK=requirements/lock.txt
log() { printf '[setup] %s\n' "$*"; }

find_python() {
  for candidate in "${PYTHON:-}" python3.11 python3; do
    [ -n "$candidate" ] || continue
    if command -v "$candidate" >/dev/null 2>&1 && \
       "$candidate" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then
      echo "$candidate"; return 0
    fi
  done
  echo "error: Python 3.11 is required (the pinned stack is tested on it); set PYTHON=/path/to/python3.11" >&2
  return 1
}

stamp_of_inputs() {
  cat requirements/*.txt setup.py tools/setup_env.sh | sha256sum | cut -d' ' -f1
}

verify() {
  "$VENV/bin/python" - <<'PY'
import importlib, sys
for name in ('torch', 'torchvision', 'mmengine', 'mmcv', 'mmcv.ops', 'mmpretrain.models', 'mmdet',
             'mmdet.models', 'torch_xla', 'timm', 'scipy', 'onnx', 'onnxruntime'):
    importlib.import_module(name)
import mmcv, mmdet, mmengine, mmpretrain, torch, torch_xla
print(f'[setup] ok: torch {torch.__version__}, torch_xla {torch_xla.__version__}, mmengine '
      f'{mmengine.__version__}, mmcv {mmcv.__version__} (ops), mmpretrain {mmpretrain.__version__}, '
      f'mmdet {mmdet.__version__}')
PY
}

STAMP_FILE="$VENV/.vit_plugin_stamp"
STAMP=$(stamp_of_inputs)
if [ -f "$STAMP_FILE" ] && [ "$(cat "$STAMP_FILE")" = "$STAMP" ] && verify 2>/dev/null; then
  exit 0
fi

start=$(date +%s)
PY=$(find_python)
if [ ! -x "$VENV/bin/python" ]; then
  log "creating $VENV with $PY"
  "$PY" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)
# Some machines' pip configuration names local index folders that do not exist; pip warns about each
# one on every call. Drop only that noise.
pip_run() { "${PIP[@]}" "$@" 2> >(grep -v 'is ignored: it is neither a file nor a directory' >&2); }
CONSTRAINTS=()
[ -f "$LOCK" ] && CONSTRAINTS=(-c "$LOCK")

log "installing the pinned stack (torch, torch-xla, OpenMMLab)"
pip_run install -q "${CONSTRAINTS[@]}" wheel ninja -r requirements/stack.txt

# mmcv: PyPI has only a source release for this torch. Build it once (CPU ops, against the torch just
# installed, hence no build isolation) and keep the wheel in the cache so a new venv takes seconds.
WHEELS="$CACHE/wheels"
mkdir -p "$WHEELS"
TORCH_TAG=$("$VENV/bin/python" -c 'import torch; print(torch.__version__.split("+")[0])')
MMCV_WHEEL=$(ls "$WHEELS"/torch-"$TORCH_TAG"/mmcv-"$MMCV_VERSION"-*.whl 2>/dev/null | head -n1 || true)
if [ -z "$MMCV_WHEEL" ]; then
  log "building mmcv $MMCV_VERSION with CPU ops from source (about 20-30 minutes on 2 cores, once)"
  BUILD_DIR=$(mktemp -d)
  MMCV_WITH_OPS=1 FORCE_CUDA=0 MAX_JOBS=${MAX_JOBS:-$(nproc)} \
    pip_run wheel -q --no-deps --no-build-isolation -w "$BUILD_DIR" "mmcv==$MMCV_VERSION"
  mkdir -p "$WHEELS/torch-$TORCH_TAG"
  mv "$BUILD_DIR"/mmcv-*.whl "$WHEELS/torch-$TORCH_TAG/"
  rm -rf "$BUILD_DIR"
  MMCV_WHEEL=$(ls "$WHEELS"/torch-"$TORCH_TAG"/mmcv-"$MMCV_VERSION"-*.whl | head -n1)
fi
log "installing $(basename "$MMCV_WHEEL")"
pip_run install -q "${CONSTRAINTS[@]}" "$MMCV_WHEEL"

log "installing test and export tools and vit_plugin (editable)"
pip_run install -q "${CONSTRAINTS[@]}" -r requirements/tests.txt -r requirements/deploy.txt
pip_run install -q --no-deps --no-build-isolation -e .

verify
echo "$STAMP" > "$STAMP_FILE"
log "done in $(( $(date +%s) - start )) s"
