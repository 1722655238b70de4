#!/usr/bin/env bash
# Create or update the project virtualenv (.venv) with the pinned stack. Idempotent: when nothing
# changed since the last successful run it only checks the imports and the operators (a few seconds).
#
# By default nothing is compiled: mmcv comes as mmcv-lite (mmcv's Python code) and vit_plugin provides
# the compiled operators our models use from torchvision, on CPU and CUDA (docs/installation.md).
#
#   bash tools/setup_env.sh              # set up (what `make setup` runs)
#   bash tools/setup_env.sh --plan       # print what it would do about mmcv on this host; change nothing
#
# Environment knobs:
#   VENV              the virtualenv (default .venv)
#   PYTHON            the interpreter for a new virtualenv (default: python3.11, else python3.12, python3.10,
#                     python3 if it is one of those)
#   MMCV_OPS          lite (mmcv-lite + torchvision kernels; the default) or compiled (mmcv built from
#                     source for this host: CPU kernels, plus CUDA ones when a GPU and a matching nvcc
#                     are present). Unset, an existing virtualenv keeps what it has.
#   MMCV_WHEEL        install this compiled mmcv wheel (built elsewhere) instead of building one
#   TORCH_CUDA_ARCH_LIST, FORCE_CUDA, CUDA_HOME, MAX_JOBS   for MMCV_OPS=compiled (vit_plugin/ops/setup_plan.py)
#   VIT_PLUGIN_CACHE  default ~/.cache/vit_plugin; wheels/ there holds compiled mmcv wheels, keyed by torch
#                     version, CUDA version (or cpu) and GPU architectures
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${VENV:-.venv}
LOCK=requirements/lock.txt
RECORD=vit_plugin_mmcv_build.json  # in the virtualenv: the compiled mmcv it has (vit_plugin/ops/setup_plan.py)
log() { printf '[setup] %s\n' "$*"; }

PLAN_ONLY=0
case "${1:-}" in
  '') ;;
  --plan) PLAN_ONLY=1 ;;
  -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
  *) echo "error: unknown argument '$1' (expected --plan or nothing)" >&2; exit 2 ;;
esac

python_ok() {  # the pinned stack has wheels for CPython 3.10, 3.11 and 3.12
  "$1" -c 'import sys; sys.exit(not (3, 10) <= sys.version_info[:2] <= (3, 12))' 2>/dev/null
}

find_python() {
  if [ -x "$VENV/bin/python" ]; then echo "$VENV/bin/python"; return 0; fi
  if [ -n "${PYTHON:-}" ]; then
    if command -v "$PYTHON" >/dev/null 2>&1 && python_ok "$PYTHON"; then echo "$PYTHON"; return 0; fi
    echo "error: PYTHON=$PYTHON is not Python 3.10, 3.11 or 3.12" >&2; return 1
  fi
  for candidate in python3.11 python3.12 python3.10 python3; do
    if command -v "$candidate" >/dev/null 2>&1 && python_ok "$candidate"; then echo "$candidate"; return 0; fi
  done
  echo "error: Python 3.10, 3.11 or 3.12 is required (CI tests 3.11); set PYTHON=/path/to/python3.11" >&2
  return 1
}

verify() {
  # Where a module is compiled at import, Python 3.12 prints mmdet's and mmpretrain's invalid-escape
  # SyntaxWarnings. They say nothing about the set-up.
  local -x PYTHONWARNINGS=ignore::SyntaxWarning
  "$VENV/bin/python" - <<'PY' || return 1
import importlib
import sys
# Where NMS / RoIAlign come from, after running them on the CPU and on every visible GPU (what
# `python -m vit_plugin.ops` prints; here in the process that checks the imports, before torch_xla's).
from vit_plugin import ops
try:
    source = ops.check()
except RuntimeError as error:
    sys.exit(f'[setup] error: {error}')
for name in ('torch', 'torchvision', 'mmengine', 'mmcv', 'mmcv.ops', 'mmpretrain.models', 'mmdet',
             'mmdet.models', 'torch_xla', 'timm', 'scipy', 'onnx', 'onnxruntime', 'vit_plugin'):
    importlib.import_module(name)
import mmcv, mmdet, mmengine, mmpretrain, torch, torch_xla
print(f'[setup] ok: Python {sys.version.split()[0]}, torch {torch.__version__}, torch_xla {torch_xla.__version__}, '
      f'mmengine {mmengine.__version__}, mmcv {mmcv.__version__}, mmpretrain {mmpretrain.__version__}, '
      f'mmdet {mmdet.__version__}')
print(f'[setup] mmcv ops: {source}')
PY
}

PY=$(find_python)
if [ "$PLAN_ONLY" = 1 ]; then
  exec "$PY" vit_plugin/ops/setup_plan.py --venv "$VENV"
fi
PLAN=$("$PY" vit_plugin/ops/setup_plan.py --venv "$VENV" --shell)
eval "$PLAN"
if [ "$PLAN_ACTION" = stop ]; then
  printf '%s\n' "$PLAN_TEXT" | sed 's/^/[setup] /' >&2
  log "stopped before changing anything"
  exit 1
fi

STAMP_FILE="$VENV/.vit_plugin_stamp"
STAMP=$( { cat requirements/*.txt setup.py tools/setup_env.sh vit_plugin/ops/setup_plan.py _vit_plugin_mmcv_ext.py;
           echo "$PLAN_MODE $PLAN_KEY $PLAN_WHEEL"; } | sha256sum | cut -d' ' -f1)
if [ -f "$STAMP_FILE" ] && [ "$(cat "$STAMP_FILE")" = "$STAMP" ] && verify 2>/dev/null; then
  exit 0
fi

start=$(date +%s)
if [ ! -x "$VENV/bin/python" ]; then
  log "creating $VENV with $PY ($("$PY" -c 'import sys; print(sys.version.split()[0])'))"
  "$PY" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)
# Some machines' pip configuration names local index folders that do not exist; pip warns about each
# one on every call. Drop only that noise.
pip_run() { "${PIP[@]}" "$@" 2> >(grep -v 'is ignored: it is neither a file nor a directory' >&2); }
has_dist() { "$VENV/bin/python" -c "import importlib.metadata as m, sys; m.distribution(sys.argv[1])" "$1" 2>/dev/null; }

# The editable install below builds with the virtualenv's own setuptools (Python 3.12 venvs have none).
pip_run install -q -c "$LOCK" 'setuptools<81' wheel

MMCV_REQUIREMENTS=()
if [ "$PLAN_MODE" = lite ]; then
  if has_dist mmcv; then  # a compiled mmcv from an earlier MMCV_OPS=compiled set-up: the same files
    log "replacing the compiled mmcv with mmcv-lite"
    pip_run uninstall -q -y mmcv
  fi
  rm -f "$VENV/$RECORD"
  MMCV_REQUIREMENTS=(-r requirements/mmcv_lite.txt)
elif [ "$PLAN_ACTION" = build ]; then
  MMCV_REQUIREMENTS=(ninja)
fi

# One resolve for everything, bound by downloads: every pin is a wheel, nothing is compiled (the
# byte-compiling is done once below, in parallel).
log "installing the pinned stack (torch, torch-xla, OpenMMLab, mmcv: $PLAN_MODE), test and export tools, vit_plugin (editable)"
pip_run install -q --no-compile -c "$LOCK" --no-build-isolation -r requirements/stack.txt "${MMCV_REQUIREMENTS[@]}" \
  -r requirements/tests.txt -r requirements/deploy.txt -e .

if [ "$PLAN_MODE" = compiled ] && [ "$PLAN_ACTION" != keep ]; then
  printf '%s\n' "$PLAN_TEXT" | sed 's/^/[setup] /'
  if [ "$PLAN_ACTION" = build ]; then
    log "compiling mmcv $PLAN_MMCV (once per key: $PLAN_KEY; a CPU-only build takes about 10-25 minutes on 2 cores)"
    BUILD_DIR=$(mktemp -d)
    # shellcheck disable=SC2086  # PLAN_BUILD_ENV is NAME=value words
    env $PLAN_BUILD_ENV MAX_JOBS="${MAX_JOBS:-$(nproc)}" \
      "${PIP[@]}" wheel -q --no-deps --no-build-isolation -w "$BUILD_DIR" "mmcv==$PLAN_MMCV" \
      2> >(grep -v 'is ignored: it is neither a file nor a directory' >&2)
    mkdir -p "$PLAN_CACHE_DIR"
    BUILT=$(ls "$BUILD_DIR"/mmcv-*.whl)
    mv "$BUILT" "$PLAN_CACHE_DIR/"
    rm -rf "$BUILD_DIR"
    PLAN_WHEEL="$PLAN_CACHE_DIR/$(basename "$BUILT")"
    printf '%s\n' "$PLAN_RECORD" | "$VENV/bin/python" -c \
      'import json, sys; r = json.load(sys.stdin); r["wheel"] = sys.argv[1]; json.dump(r, open(sys.argv[2], "w"), indent=1)' \
      "$PLAN_WHEEL" "$PLAN_CACHE_DIR/build.json"
  fi
  has_dist mmcv-lite && pip_run uninstall -q -y mmcv-lite
  has_dist mmcv && pip_run uninstall -q -y mmcv
  log "installing $(basename "$PLAN_WHEEL")"
  pip_run install -q --no-deps "$PLAN_WHEEL"
  printf '%s\n' "$PLAN_RECORD" | "$VENV/bin/python" -c \
    'import json, sys; r = json.load(sys.stdin); r["wheel"] = sys.argv[1]; json.dump(r, open(sys.argv[2], "w"), indent=1)' \
    "$PLAN_WHEEL" "$VENV/$RECORD"
fi

# mmcv._ext from vit_plugin whenever there is no compiled one, whatever a script imports first.
"$VENV/bin/python" -c 'import sysconfig, _vit_plugin_mmcv_ext as h; h.write_startup_file(sysconfig.get_paths()["purelib"])'

# Byte-compile everything installed, and vit_plugin, once and on every core. Python would otherwise do it
# at first import, but not where PYTHONDONTWRITEBYTECODE is set (CI images and Dockerfiles often set it):
# there every new process compiles torch, mmdet and mmpretrain again in memory, and starting one training
# process takes about 20 s instead of 7 on 2 cores. (Files a Python version cannot compile, if a package
# ships any, are left to the interpreter: they are not imported.)
log "byte-compiling the installed packages"
mapfile -t SITE_DIRS < <("$VENV/bin/python" -c \
  'import sysconfig; print("\n".join(sorted({sysconfig.get_paths()[k] for k in ("purelib", "platlib")})))')
# Test folders are left out: nothing imports them.
PYTHONWARNINGS=ignore::SyntaxWarning "$VENV/bin/python" -m compileall -qq -j 0 -x '/(tests?|testing/_internal)/' \
  "${SITE_DIRS[@]}" vit_plugin _vit_plugin_mmcv_ext.py \
  || log "some files could not be byte-compiled; Python compiles them when imported"

verify
echo "$STAMP" > "$STAMP_FILE"
log "done in $(( $(date +%s) - start )) s"
