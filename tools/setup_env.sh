#!/usr/bin/env bash
# Create or update a project virtualenv with one of the two pinned stacks. Idempotent: when nothing
# changed since the last successful run it only checks the imports and the operators (a few seconds).
#
# Stacks (docs/installation.md#two-stacks):
#   current  (the default) the maintained OpenMMLab forks (onedl-mmengine, onedl-mmcv, onedl-mmpretrain,
#            onedl-mmdetection; same import names) on the newest torch and numpy 2; Python 3.11-3.13
#   classic  the last upstream OpenMMLab releases on torch 2.9 with torch_xla (TPUs); Python 3.10-3.12
#
# By default nothing is compiled: mmcv comes without its compiled operators (mmcv-lite, or onedl-mmcv
# built as a pure wheel) and vit_plugin provides the ones our models use from torchvision, on CPU and CUDA.
#
#   bash tools/setup_env.sh              # set up (what `make setup` runs)
#   bash tools/setup_env.sh --plan       # print what it would do about mmcv on this host; change nothing
#
# Environment knobs:
#   STACK             current (default) or classic
#   VENV              the virtualenv (default .venv for current, .venv-classic for classic). A virtualenv
#                     holds one stack: asked for the other, the set-up stops before changing anything.
#   PYTHON            the interpreter for a new virtualenv (default: the first of python3.12, python3.11,
#                     python3.13, python3 that the stack supports; classic: python3.11, python3.12,
#                     python3.10, python3)
#   MMCV_OPS          lite (no compiled operators; the default) or compiled (mmcv built from source for
#                     this host: CPU kernels, plus CUDA ones when a GPU and a matching nvcc are present).
#                     Unset, an existing virtualenv keeps what it has.
#   MMCV_WHEEL        install this compiled mmcv wheel (built elsewhere) instead of building one
#   TORCH_CUDA_ARCH_LIST, FORCE_CUDA, CUDA_HOME, MAX_JOBS   for MMCV_OPS=compiled (tools/setup_plan.py)
#   VIT_PLUGIN_CACHE  default ~/.cache/vit_plugin; wheels/ there holds built mmcv wheels, keyed by stack,
#                     torch version, CUDA version (or cpu) and GPU architectures
set -euo pipefail
cd "$(dirname "$0")/.."

STACK=${STACK:-current}
case "$STACK" in
  current) DEFAULT_VENV=.venv; PY_MIN=11; PY_MAX=13; PY_CANDIDATES="python3.12 python3.11 python3.13 python3" ;;
  classic) DEFAULT_VENV=.venv-classic; PY_MIN=10; PY_MAX=12; PY_CANDIDATES="python3.11 python3.12 python3.10 python3" ;;
  *) echo "error: STACK=$STACK: use current (the default) or classic" >&2; exit 2 ;;
esac
export STACK
VENV=${VENV:-$DEFAULT_VENV}
REQ=requirements/$STACK
LOCK=$REQ/lock.txt
STACK_FILE=vit_plugin_stack  # in the virtualenv: the stack it holds
RECORD=vit_plugin_mmcv_build.json  # in the virtualenv: the compiled mmcv it has (tools/setup_plan.py)
log() { printf '[setup] %s\n' "$*"; }

PLAN_ONLY=0
case "${1:-}" in
  '') ;;
  --plan) PLAN_ONLY=1 ;;
  -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
  *) echo "error: unknown argument '$1' (expected --plan or nothing)" >&2; exit 2 ;;
esac

python_ok() {  # the Pythons the stack's pinned wheels exist for
  "$1" -c "import sys; sys.exit(not (3, $PY_MIN) <= sys.version_info[:2] <= (3, $PY_MAX))" 2>/dev/null
}

# The stack a virtualenv holds: its record, else (a virtualenv made before the record existed) what its
# OpenMMLab distributions say; empty for a virtualenv with neither.
venv_stack() {
  if [ -f "$VENV/$STACK_FILE" ]; then cat "$VENV/$STACK_FILE"; return; fi
  [ -x "$VENV/bin/python" ] || return 0
  "$VENV/bin/python" - <<'PY' 2>/dev/null || true
import importlib.metadata as m
names = {d.metadata['Name'].lower().replace('_', '-') for d in m.distributions()}
if names & {'onedl-mmengine', 'onedl-mmcv', 'onedl-mmpretrain', 'onedl-mmdetection'}:
    print('current')
elif names & {'mmengine', 'mmcv', 'mmcv-lite', 'mmpretrain', 'mmdet'}:
    print('classic')
PY
}

find_python() {
  if [ -x "$VENV/bin/python" ]; then echo "$VENV/bin/python"; return 0; fi
  if [ -n "${PYTHON:-}" ]; then
    if command -v "$PYTHON" >/dev/null 2>&1 && python_ok "$PYTHON"; then echo "$PYTHON"; return 0; fi
    echo "error: PYTHON=$PYTHON: the $STACK stack needs Python 3.$PY_MIN-3.$PY_MAX" >&2; return 1
  fi
  for candidate in $PY_CANDIDATES; do
    if command -v "$candidate" >/dev/null 2>&1 && python_ok "$candidate"; then echo "$candidate"; return 0; fi
  done
  echo "error: the $STACK stack needs Python 3.$PY_MIN-3.$PY_MAX; set PYTHON=/path/to/python3.$PY_MIN" >&2
  return 1
}

verify() {
  # Where a module is compiled at import, Python 3.12 prints mmdet's and mmpretrain's invalid-escape
  # SyntaxWarnings. They say nothing about the set-up.
  local -x PYTHONWARNINGS=ignore::SyntaxWarning
  "$VENV/bin/python" - <<'PY' || return 1
import importlib
import importlib.metadata as metadata
import os
import sys
# Where NMS / RoIAlign come from, after running them on the CPU and on every visible GPU (what
# `python -m vit_plugin.ops` prints; here in the process that checks the imports, before torch_xla's).
from vit_plugin import ops
from vit_plugin.stack import describe_gpu_access, stack_of_environment
try:
    source = ops.check()
except RuntimeError as error:
    sys.exit(f'[setup] error: {error}')
stack = os.environ['STACK']
found = stack_of_environment()
if found != stack:
    sys.exit(f'[setup] error: asked for the {stack} stack, the virtualenv holds {found or "neither"}')
modules = ['torch', 'torchvision', 'mmengine', 'mmcv', 'mmcv.ops', 'mmpretrain.models', 'mmdet',
           'mmdet.models', 'timm', 'scipy', 'transformers', 'onnx', 'onnxruntime', 'torch.utils.tensorboard',
           'vit_plugin']
if stack == 'classic':
    modules.append('torch_xla')
for name in modules:
    importlib.import_module(name)
import numpy, torch
def installed(*names):
    for name in names:
        try:
            return f'{name} {metadata.version(name)}'
        except metadata.PackageNotFoundError:
            pass
    return f'{names[0]} (no distribution)'
versions = ', '.join(installed(*names) for names in (
    (('torch_xla',), ('mmengine',), ('mmcv', 'mmcv-lite'), ('mmpretrain',), ('mmdet',)) if stack == 'classic' else
    (('onedl-mmengine',), ('onedl-mmcv',), ('onedl-mmpretrain',), ('onedl-mmdetection',))))
print(f'[setup] ok: the {stack} stack: Python {sys.version.split()[0]}, torch {torch.__version__}, '
      f'numpy {numpy.__version__}, {versions}')
print(f'[setup] mmcv ops: {source}')
gpu = describe_gpu_access()
if gpu:
    print(f'[setup] {gpu}')
PY
}

PY=$(find_python)
if [ "$PLAN_ONLY" = 1 ]; then
  exec "$PY" tools/setup_plan.py --venv "$VENV"
fi

# A virtualenv holds one stack: the other one's packages installed over it would leave a mix of both
# (the forks and the upstream releases share their import names).
HELD=$(venv_stack)
if [ -n "$HELD" ] && [ "$HELD" != "$STACK" ]; then
  log "error: $VENV holds the $HELD stack; STACK=$STACK asks for the other, and one virtualenv never holds both."
  log "Keep it and use another folder for this stack (VENV=.venv-$STACK make setup), or remove it first"
  log "(rm -rf $VENV) to rebuild it with the $STACK stack. Nothing was changed."
  exit 1
fi

PLAN=$("$PY" tools/setup_plan.py --venv "$VENV" --shell)
eval "$PLAN"
if [ "$PLAN_ACTION" = stop ]; then
  printf '%s\n' "$PLAN_TEXT" | sed 's/^/[setup] /' >&2
  log "stopped before changing anything"
  exit 1
fi

STAMP_FILE="$VENV/.vit_plugin_stamp"
STAMP=$( { echo "$STACK"; cat requirements/*.txt "$REQ"/*.txt setup.py tools/setup_env.sh tools/setup_plan.py \
             _vit_plugin_mmcv_ext.py; echo "$PLAN_MODE $PLAN_KEY $PLAN_WHEEL"; } | sha256sum | cut -d' ' -f1)
if [ -f "$STAMP_FILE" ] && [ "$(cat "$STAMP_FILE")" = "$STAMP" ] && verify 2>/dev/null; then
  exit 0
fi

start=$(date +%s)
if [ ! -x "$VENV/bin/python" ]; then
  log "creating $VENV for the $STACK stack with $PY ($("$PY" -c 'import sys; print(sys.version.split()[0])'))"
  "$PY" -m venv "$VENV"
fi
echo "$STACK" > "$VENV/$STACK_FILE"
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)
# Some machines' pip configuration names local index folders that do not exist; pip warns about each
# one on every call. Drop only that noise.
pip_run() { "${PIP[@]}" "$@" 2> >(grep -v 'is ignored: it is neither a file nor a directory' >&2); }
has_dist() { "$VENV/bin/python" -c "import importlib.metadata as m, sys; m.distribution(sys.argv[1])" "$1" 2>/dev/null; }
CACHE=${VIT_PLUGIN_CACHE:-$HOME/.cache/vit_plugin}

# The editable install below builds with the virtualenv's own setuptools (Python 3.12 venvs have none).
# uv installs the stack: from its cache (~/.cache/uv) a later virtualenv links the files instead of
# downloading and unpacking them again (docs/installation.md#set-up-time).
pip_run install -q -c "$LOCK" setuptools wheel uv

MMCV_REQUIREMENTS=()
if [ "$PLAN_MODE" = lite ]; then
  if [ -f "$VENV/$RECORD" ] || has_dist mmcv; then  # a compiled mmcv from an earlier MMCV_OPS=compiled set-up
    log "replacing the compiled mmcv with $PLAN_LITE_DIST without compiled operators"
    pip_run uninstall -q -y "$PLAN_SOURCE_DIST"
  fi
  rm -f "$VENV/$RECORD"
  if [ "$STACK" = current ]; then
    # onedl-mmcv is a source package: built in pip's isolated build environment, which has no torch, it
    # compiles nothing and makes a pure wheel. Built once, then reused from the cache.
    LITE_DIR="$CACHE/wheels/pure"
    LITE_WHEEL=$(ls "$LITE_DIR"/onedl_mmcv-"$PLAN_MMCV"-py3-none-any.whl 2>/dev/null || true)
    if [ -z "$LITE_WHEEL" ]; then
      log "building onedl-mmcv $PLAN_MMCV as a pure wheel (once; kept in $LITE_DIR)"
      BUILD_DIR=$(mktemp -d)
      pip_run wheel -q --no-deps -w "$BUILD_DIR" "onedl-mmcv==$PLAN_MMCV"
      mkdir -p "$LITE_DIR"
      BUILT=$(ls "$BUILD_DIR"/onedl_mmcv-"$PLAN_MMCV"-py3-none-any.whl) || {
        log "error: onedl-mmcv $PLAN_MMCV did not build as a pure wheel ($(ls "$BUILD_DIR"))"; exit 1; }
      mv "$BUILT" "$LITE_DIR/"
      rm -rf "$BUILD_DIR"
      LITE_WHEEL="$LITE_DIR/$(basename "$BUILT")"
    fi
    MMCV_REQUIREMENTS=("$LITE_WHEEL")
  else
    MMCV_REQUIREMENTS=(-r "$REQ/mmcv_lite.txt")
  fi
elif [ "$PLAN_ACTION" = build ]; then
  MMCV_REQUIREMENTS=(ninja)
fi

# One resolve for everything, bound by downloads: every pin is a wheel, nothing is compiled (the
# byte-compiling is done once below, in parallel).
log "installing the $STACK stack (torch, OpenMMLab$([ "$STACK" = classic ] && echo ', torch-xla'), mmcv: $PLAN_MODE), test and export tools, TensorBoard, vit_plugin (editable)"
INSTALL_ARGS=(-c "$LOCK" --no-build-isolation -r "$REQ/stack.txt" "${MMCV_REQUIREMENTS[@]}"
  -r requirements/tests.txt -r requirements/deploy.txt -r requirements/vis.txt -e .)
# uv reads no pip configuration: it gets pip's indexes, links, certificate and timeout (tools/setup_plan.py).
eval "$("$VENV/bin/python" tools/setup_plan.py --uv)"
if ! env "${UV_ENV[@]}" "$VENV/bin/uv" pip install -q --python "$VENV/bin/python" "${UV_ARGS[@]}" "${INSTALL_ARGS[@]}"; then
  log "uv could not install the stack (above); installing it with pip"
  pip_run install -q --no-compile "${INSTALL_ARGS[@]}"
fi

if [ "$PLAN_MODE" = compiled ] && [ "$PLAN_ACTION" != keep ]; then
  printf '%s\n' "$PLAN_TEXT" | sed 's/^/[setup] /'
  if [ "$PLAN_ACTION" = build ]; then
    log "compiling $PLAN_SOURCE_DIST $PLAN_MMCV (once per key: $PLAN_KEY; a CPU-only build takes about 10-25 minutes on 2 cores)"
    BUILD_DIR=$(mktemp -d)
    # shellcheck disable=SC2086  # PLAN_BUILD_ENV is NAME=value words
    env $PLAN_BUILD_ENV MAX_JOBS="${MAX_JOBS:-$(nproc)}" \
      "${PIP[@]}" wheel -q --no-deps --no-build-isolation -w "$BUILD_DIR" "$PLAN_SOURCE_DIST==$PLAN_MMCV" \
      2> >(grep -v 'is ignored: it is neither a file nor a directory' >&2)
    mkdir -p "$PLAN_CACHE_DIR"
    BUILT=$(ls "$BUILD_DIR"/*mmcv-*.whl)
    mv "$BUILT" "$PLAN_CACHE_DIR/"
    rm -rf "$BUILD_DIR"
    PLAN_WHEEL="$PLAN_CACHE_DIR/$(basename "$BUILT")"
    printf '%s\n' "$PLAN_RECORD" | "$VENV/bin/python" -c \
      'import json, sys; r = json.load(sys.stdin); r["wheel"] = sys.argv[1]; json.dump(r, open(sys.argv[2], "w"), indent=1)' \
      "$PLAN_WHEEL" "$PLAN_CACHE_DIR/build.json"
  fi
  has_dist "$PLAN_LITE_DIST" && pip_run uninstall -q -y "$PLAN_LITE_DIST"
  has_dist "$PLAN_SOURCE_DIST" && pip_run uninstall -q -y "$PLAN_SOURCE_DIST"
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
# there every new process compiles torch, mmdet and mmpretrain again in memory, which makes starting one
# training process several times slower (docs/installation.md). (Files a Python version cannot compile, if
# a package ships any, are left to the interpreter: they are not imported.)
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
