"""Which mmcv ``tools/setup_env.sh`` installs on this host, and for a compiled one how it is built and
where its wheel is cached: the decision as data, so that ``--plan`` can print it and tests can check it.

    python tools/setup_plan.py --venv .venv   # the plan in words (what `setup_env.sh --plan` prints)
    python tools/setup_plan.py --venv .venv --shell   # as shell assignments (setup_env.sh evals them)
    .venv/bin/python tools/setup_plan.py --uv         # uv's arguments for that Python's pip configuration

Standard library only: it runs by path (before the virtualenv exists, with the Python the virtualenv
gets), and the tests load it from this file (tests/tools/test_setup_plan.py). It is no part of the
installed package.

The decision:

- ``MMCV_OPS=lite`` (the default for a new virtualenv): mmcv without compiled operators, nothing compiled
  (classic stack: ``mmcv-lite`` from the lock; current stack: ``onedl-mmcv``, published as source only, built
  where the build environment has no torch, which makes it pure Python); vit_plugin provides NMS, RoIAlign
  and the sigmoid focal loss from torchvision (CPU and CUDA).
- ``MMCV_OPS=compiled``: mmcv from source with its operators, built for this host and the locked torch:
  - no GPU visible (and ``FORCE_CUDA`` not 1), or a CPU-only torch: CPU kernels;
  - a GPU visible (or ``FORCE_CUDA=1``) and an ``nvcc`` whose major version is torch's CUDA major: CPU and
    CUDA kernels for ``TORCH_CUDA_ARCH_LIST``, else for the visible GPUs' architectures;
  - a GPU visible and no such ``nvcc``: a stop before anything changes, naming the ways forward.
  The wheel is cached under ``<cache>/wheels/torch-<version>-<cpu | cuXYZ-sm_A-sm_B>/`` and reused by
  every later set-up with the same key (the file name carries the Python tag).
- ``MMCV_WHEEL=/path/to/mmcv-2.1.0-<tags>.whl`` (current stack: ``onedl_mmcv-2.3.6-<tags>.whl``): that wheel
  (built elsewhere, e.g. once for a cluster).
- Without ``MMCV_OPS`` the virtualenv keeps what it has: a compiled mmcv installed by the set-up (built
  here or from ``MMCV_WHEEL``) stays while it fits the locked torch and the Python.

Inputs from the environment: STACK (``current`` unless set), MMCV_OPS, MMCV_WHEEL, TORCH_CUDA_ARCH_LIST, FORCE_CUDA, CUDA_HOME (or
CUDA_PATH), CUDA_VISIBLE_DEVICES, VIT_PLUGIN_CACHE, PATH (``nvcc``, ``nvidia-smi``). torch's version and
CUDA version are read from the lock (what the set-up installs: PyPI's torch brings the
``nvidia-cuda-runtime`` it was built with); ``VIT_PLUGIN_CUDA_PROBE='{"torch": "2.9.0", "cuda": "12.8"}'``
(``"cuda": null`` for a CPU-only torch) replaces that probe.
"""
import argparse
import ast
import json
import os
import os.path as osp
import re
import shlex
import shutil
import subprocess
import sys

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))  # the checkout being set up (this file is tools/setup_plan.py)
#: What differs about mmcv between the two stacks (``STACK``; tools/setup_env.sh).
#: ``lite``: the distribution without compiled operators; ``source``: the one built with them; ``wheel``: the
#: compiled wheel's file-name prefix; ``versions``: what the stack's mmdet accepts, and why.
STACKS = {
    'current': dict(lite='onedl-mmcv', source='onedl-mmcv', wheel='onedl_mmcv', versions=((2, 0, 0), (3, 0, 0)),
                    why='onedl-mmdetection 3.5 needs mmcv >= 2.0, < 3.0'),
    'classic': dict(lite='mmcv-lite', source='mmcv', wheel='mmcv', versions=((2, 0, 0), (2, 2, 0)),
                    why='mmdet 3.3 needs mmcv >= 2.0, < 2.2'),
}


def stack_name(env=None):
    """The stack being set up: ``STACK`` (``current`` unless set)."""
    name = (os.environ if env is None else env).get('STACK', '').strip() or 'current'
    if name not in STACKS:
        raise ValueError(f'STACK={name}: use current (the default) or classic')
    return name


def lock_path(stack):
    return osp.join(REPO, 'requirements', stack, 'lock.txt')


LOCK = lock_path('current')
#: In the virtualenv (``sys.prefix``): what the set-up installed as compiled mmcv (vit_plugin.ops reads it).
RECORD = 'vit_plugin_mmcv_build.json'
#: Next to each cached wheel: what it was built for.
SIDECAR = 'build.json'
MODES = ('lite', 'compiled')


# ----------------------------------------------------------------------------------------------- inputs
def _marker_holds(marker, python_version):
    """Evaluates the ``python_version`` clauses (joined by ``and``) the lock uses."""
    ops = {'<': lambda a, b: a < b, '<=': lambda a, b: a <= b, '>': lambda a, b: a > b,
           '>=': lambda a, b: a >= b, '==': lambda a, b: a == b, '!=': lambda a, b: a != b}
    for clause in marker.split(' and '):
        match = re.fullmatch(r'\s*python_version\s*(<=|>=|==|!=|<|>)\s*["\'](\d+)\.(\d+)["\']\s*', clause)
        if not match:
            raise ValueError(f'{LOCK}: unsupported environment marker {clause.strip()!r} (only python_version '
                             'comparisons are understood here)')
        if not ops[match.group(1)](python_version, (int(match.group(2)), int(match.group(3)))):
            return False
    return True


def read_lock(path=LOCK, python_version=None):
    """``{normalised name: version}`` of the lock's pins that apply to ``python_version`` (default: this
    interpreter's)."""
    python_version = python_version or sys.version_info[:2]
    pins = {}
    with open(path) as f:
        for line in f:
            line = line.split('#', 1)[0].strip()
            if '==' not in line:
                continue
            requirement, _, marker = line.partition(';')
            if marker and not _marker_holds(marker, python_version):
                continue
            name, version = (s.strip() for s in requirement.split('=='))
            pins[re.sub(r'[-_.]+', '-', name).lower()] = version
    return pins


def torch_probe(env, pins):
    """torch's version and the CUDA version it is built with (None: CPU-only), from
    ``VIT_PLUGIN_CUDA_PROBE`` or the lock."""
    if env.get('VIT_PLUGIN_CUDA_PROBE'):
        probe = json.loads(env['VIT_PLUGIN_CUDA_PROBE'])
        return dict(torch=str(probe['torch']), cuda=probe.get('cuda'), source='VIT_PLUGIN_CUDA_PROBE')
    if 'torch' not in pins:
        raise ValueError(f'{LOCK} pins no torch')
    cuda = None
    for name, version in pins.items():
        if re.fullmatch(r'nvidia-cuda-runtime(-cu\d+)?', name):
            cuda = '.'.join(version.split('.')[:2])
    return dict(torch=pins['torch'].split('+')[0], cuda=cuda, source='the lock')


def _run(cmd, env):
    try:
        result = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return result.stdout if result.returncode == 0 else None


def visible_gpus(env):
    """The GPUs ``nvidia-smi`` lists, restricted to ``CUDA_VISIBLE_DEVICES``: dicts with index, uuid,
    name and capability ('9.0'; None if the driver cannot say)."""
    smi = shutil.which('nvidia-smi', path=env.get('PATH', ''))
    if smi is None:
        return []
    out = _run([smi, '--query-gpu=index,uuid,name,compute_cap', '--format=csv,noheader'], env)
    if out is None:  # drivers before compute_cap was queryable
        out = _run([smi, '--query-gpu=index,uuid,name', '--format=csv,noheader'], env) or ''
    gpus = []
    for line in out.splitlines():
        fields = [f.strip() for f in line.split(',')]
        if len(fields) >= 3 and fields[0].isdigit():
            cap = fields[3] if len(fields) > 3 and re.fullmatch(r'\d+\.\d+', fields[3]) else None
            gpus.append(dict(index=fields[0], uuid=fields[1], name=fields[2], capability=cap))
    visible = env.get('CUDA_VISIBLE_DEVICES')
    if visible is None:
        return gpus
    chosen = []
    for item in (v.strip() for v in visible.split(',')):
        if not item or item.startswith('-'):
            break  # CUDA stops at the first invalid entry
        match = [g for g in gpus if item in (g['index'], g['uuid']) or (len(item) > 4 and g['uuid'].startswith(item))]
        if not match:
            break
        chosen.extend(g for g in match if g not in chosen)
    return chosen


def find_nvcc(env):
    """The nvcc torch's extension builder would use (CUDA_HOME / CUDA_PATH, else PATH, else
    /usr/local/cuda): dict with path, cuda_home, version ('12.8') and archs (e.g. {'9.0', ...}, or None
    when nvcc cannot list them); None when there is none."""
    home = env.get('CUDA_HOME') or env.get('CUDA_PATH')
    if home:
        candidates = [osp.join(home, 'bin', 'nvcc')]
    else:
        candidates = [p for p in (shutil.which('nvcc', path=env.get('PATH', '')), '/usr/local/cuda/bin/nvcc') if p]
    for path in candidates:
        if not (osp.isfile(path) and os.access(path, os.X_OK)):
            continue
        out = _run([path, '--version'], env) or ''
        match = re.search(r'release (\d+)\.(\d+)', out)
        if not match:
            continue
        listed = _run([path, '--list-gpu-arch'], env)
        archs = None
        if listed:
            archs = {f'{m[0]}.{m[1:]}' for m in re.findall(r'compute_(\d+)', listed)}
        return dict(path=path, cuda_home=osp.dirname(osp.dirname(osp.realpath(path))),
                    version=f'{match.group(1)}.{match.group(2)}', archs=archs)
    return None


def parse_arch_list(value):
    """``TORCH_CUDA_ARCH_LIST`` ('8.0;9.0+PTX', '8.6 9.0') -> ['8.0', '9.0+PTX']."""
    archs = []
    for item in re.split(r'[;\s,]+', value.strip()):
        if not item:
            continue
        if not re.fullmatch(r'\d+\.\d+[a-z]?(\+PTX)?', item):
            raise ValueError(f"TORCH_CUDA_ARCH_LIST: {item!r} is not an architecture such as '8.0', '9.0a' or "
                             "'9.0+PTX'")
        if item not in archs:
            archs.append(item)
    return archs


def venv_state(venv):
    """What the virtualenv has: its compiled-mmcv record (None for mmcv-lite or no virtualenv)."""
    path = osp.join(venv, RECORD)
    if osp.isfile(path):
        with open(path) as f:
            return json.load(f)
    return None


# ----------------------------------------------------------------------------------------------- decision
def _sm(arch):
    return 'sm_' + arch.replace('.', '')


def _wheel_tags(path, prefix='mmcv'):
    match = re.fullmatch(re.escape(prefix) + r'-(\d+)\.(\d+)\.(\d+)-(cp\d+)-[^-]+-[^-]+\.whl', osp.basename(path))
    return match


def decide(env, probe, gpus, nvcc, record, cache, python_tag, mmcv_version, stack='classic'):
    """The plan. ``action`` is one of:

    - 'lite': install mmcv-lite (nothing compiled);
    - 'keep': the compiled mmcv in the virtualenv stays (MMCV_OPS unset and it fits torch and Python, or
      it matches the key);
    - 'cached': install the cached wheel ``wheel``;
    - 'wheel': install the wheel ``MMCV_WHEEL`` names;
    - 'build': compile ``mmcv==mmcv_version`` with ``build_env`` into ``cache_dir``, then install it;
    - 'stop': change nothing and print ``message``.
    """
    spec = STACKS[stack]
    plan = dict(mode=None, action=None, wheel=None, cache_dir=None, key=None, build_env={}, cuda=None, archs=[],
                torch=probe['torch'], mmcv=mmcv_version, python=python_tag, message='', notes=[], stack=stack,
                lite_dist=spec['lite'], source_dist=spec['source'])

    def stop(message):
        plan.update(action='stop', message=message)
        return plan

    requested = env.get('MMCV_OPS', '').strip().lower()
    if requested and requested not in MODES:
        plan['mode'] = requested
        return stop(f"MMCV_OPS={requested!r}: use 'lite' (mmcv-lite, operators from torchvision; the default) or "
                    "'compiled' (mmcv built from source for this host)")
    wheel = env.get('MMCV_WHEEL', '').strip()
    if wheel:
        plan['mode'] = 'compiled'
        if requested == 'lite':
            return stop('MMCV_WHEEL installs a compiled mmcv, MMCV_OPS=lite asks for none: unset one of them')
        if not osp.isfile(wheel):
            return stop(f'MMCV_WHEEL={wheel}: no such file')
        tags = _wheel_tags(wheel, spec['wheel'])
        if not tags:
            return stop(f"MMCV_WHEEL={wheel}: not a compiled {spec['source']} wheel, which the {stack} stack takes "
                        f"(expected {spec['wheel']}-<version>-<python tag>-<abi>-<platform>.whl)")
        version = tuple(int(v) for v in tags.groups()[:3])
        low, high = spec['versions']
        if not low <= version < high:
            return stop(f'MMCV_WHEEL={wheel}: mmcv {".".join(map(str, version))}; {spec["why"]}')
        if tags.group(4) != python_tag:
            return stop(f'MMCV_WHEEL={wheel}: built for {tags.group(4)}, the virtualenv runs {python_tag}')
        plan.update(action='wheel', wheel=osp.abspath(wheel))
        sidecar = osp.join(osp.dirname(osp.abspath(wheel)), SIDECAR)
        if osp.isfile(sidecar):
            with open(sidecar) as f:
                built = json.load(f)
            plan.update(cuda=built.get('cuda'), archs=built.get('archs') or [], key=built.get('key'))
        plan['notes'].append('the wheel is installed as it is (what it was built for: '
                             + (f"key {plan['key']}" if plan['key'] else 'unknown, no build.json beside it') + ')')
        return plan
    mode = requested or ('compiled' if record else 'lite')
    plan['mode'] = mode
    installed = (record.get('torch'), record.get('python'), record.get('mmcv')) if record else None
    fits = installed == (probe['torch'], python_tag, mmcv_version)
    if mode == 'compiled' and not requested and fits:
        # MMCV_OPS unset: the compiled mmcv the virtualenv has stays while it fits torch and Python (a wheel
        # from MMCV_WHEEL included, whose key may be unknown). MMCV_OPS=compiled re-decides for this host.
        plan.update(action='keep', wheel=record.get('wheel'), key=record.get('key'), cuda=record.get('cuda'),
                    archs=record.get('archs') or [])
        return plan
    if mode == 'lite':
        plan.update(action='lite', cuda=probe['cuda'])
        devices = f"CPU and CUDA {probe['cuda']}" if probe['cuda'] else 'CPU'
        plan['notes'].append(f"{spec['lite']} {mmcv_version} without compiled operators: nothing is compiled; NMS, "
                             f'RoIAlign and the sigmoid focal loss come from torchvision ({devices} kernels) '
                             'through vit_plugin')
        return plan

    # ---- compiled
    force_cuda = env.get('FORCE_CUDA', '') == '1'
    cuda_target = bool(gpus) or force_cuda
    if cuda_target and not probe['cuda']:
        plan['notes'].append(f"torch {probe['torch']} is a CPU-only build: CPU kernels only")
        cuda_target = False
    if cuda_target:
        arch_list = env.get('TORCH_CUDA_ARCH_LIST', '').strip()
        if arch_list:
            try:
                archs = parse_arch_list(arch_list)
            except ValueError as error:
                return stop(str(error))
        else:
            archs = sorted({g['capability'] for g in gpus if g['capability']},
                           key=lambda a: tuple(map(int, a.split('.'))))
            if not archs or any(g['capability'] is None for g in gpus):
                return stop('cannot tell the GPU architectures to compile for (nvidia-smi does not report them'
                            + (' and no GPU is visible' if not gpus else '') + "): set TORCH_CUDA_ARCH_LIST, e.g. "
                            "TORCH_CUDA_ARCH_LIST='8.0;9.0'")
        torch_major = probe['cuda'].split('.')[0]
        gpu_words = (', '.join(f"{g['name']} (sm_{(g['capability'] or '?').replace('.', '')})" for g in gpus)
                     if gpus else 'FORCE_CUDA=1')
        ways = ('Ways forward: (1) install a CUDA toolkit {major}.x (its nvcc) and point CUDA_HOME at it, or put its '
                'bin/ on PATH, then run `MMCV_OPS=compiled make setup` again; (2) build the wheel where such an nvcc '
                'exists (same torch and Python) and install it here with `MMCV_WHEEL=/path/to/{prefix}-{mmcv}-{py}-*.whl '
                'make setup`. Or leave MMCV_OPS unset: the default set-up compiles nothing and runs NMS and RoIAlign '
                'on CUDA through torchvision.').format(major=torch_major, mmcv=mmcv_version, py=python_tag,
                                                        prefix=spec['wheel'])
        if nvcc is None:
            where = (f"{env.get('CUDA_HOME') or env.get('CUDA_PATH')}/bin/nvcc" if env.get('CUDA_HOME') or
                     env.get('CUDA_PATH') else 'PATH or /usr/local/cuda')
            return stop(f"a compiled mmcv with CUDA kernels is needed for {gpu_words}, and torch {probe['torch']} "
                        f"is built with CUDA {probe['cuda']}, but there is no nvcc ({where}). {ways}")
        if nvcc['version'].split('.')[0] != torch_major:
            return stop(f"nvcc {nvcc['version']} ({nvcc['path']}) does not match torch {probe['torch']}'s CUDA "
                        f"{probe['cuda']} (the major versions must agree) for {gpu_words}. {ways}")
        if nvcc['archs'] is not None:
            unsupported = [a for a in archs if a.split('+')[0].rstrip('a') not in nvcc['archs']]
            if unsupported:
                return stop(f"nvcc {nvcc['version']} ({nvcc['path']}) cannot compile for "
                            f"{', '.join(_sm(a) for a in unsupported)}: use a newer CUDA {torch_major}.x toolkit, "
                            'or set TORCH_CUDA_ARCH_LIST to architectures it supports')
        key = f"torch-{probe['torch']}-cu{probe['cuda'].replace('.', '')}-" + '-'.join(_sm(a) for a in archs)
        plan.update(cuda=probe['cuda'], archs=[_sm(a) for a in archs])
        plan['build_env'] = dict(MMCV_WITH_OPS='1', FORCE_CUDA='1', TORCH_CUDA_ARCH_LIST=';'.join(archs),
                                 CUDA_HOME=nvcc['cuda_home'])
        plan['notes'].append(f"CPU and CUDA kernels for {', '.join(plan['archs'])} with nvcc {nvcc['version']} "
                             f"({nvcc['path']}); CUDA builds take several times longer than the CPU-only build, "
                             'more with each architecture')
    else:
        key = f"torch-{probe['torch']}-cpu"
        plan['build_env'] = dict(MMCV_WITH_OPS='1', FORCE_CUDA='0')
        plan['notes'].append('CPU kernels (no GPU visible)' if not gpus else 'CPU kernels')
    plan['key'] = key
    plan['cache_dir'] = osp.join(cache, 'wheels', key)
    if record and (record.get('key'), record.get('python'), record.get('mmcv')) == (key, python_tag, mmcv_version):
        plan.update(action='keep', wheel=record.get('wheel'))
        return plan
    cached = sorted(f for f in (os.listdir(plan['cache_dir']) if osp.isdir(plan['cache_dir']) else [])
                    if f.startswith(f"{spec['wheel']}-{mmcv_version}-{python_tag}-") and f.endswith('.whl'))
    if cached:
        plan.update(action='cached', wheel=osp.join(plan['cache_dir'], cached[0]))
    else:
        plan['action'] = 'build'
    return plan


def make_plan(venv, env=None, lock=None):
    env = dict(os.environ if env is None else env)
    stack = stack_name(env)
    lock = lock or lock_path(stack)
    pins = read_lock(lock)
    spec = STACKS[stack]
    mmcv_version = pins.get(spec['lite']) or pins.get(spec['source'])
    if mmcv_version is None:
        raise ValueError(f"{lock} pins neither {spec['lite']} nor {spec['source']}")
    probe = torch_probe(env, pins)
    cache = env.get('VIT_PLUGIN_CACHE') or osp.join(osp.expanduser('~'), '.cache', 'vit_plugin')
    python_tag = f'cp{sys.version_info[0]}{sys.version_info[1]}'
    wants_compiled = env.get('MMCV_OPS', '').strip().lower() == 'compiled' or venv_state(venv)
    gpus = visible_gpus(env) if wants_compiled else []
    nvcc = find_nvcc(env) if wants_compiled and (gpus or env.get('FORCE_CUDA') == '1') else None
    plan = decide(env, probe, gpus, nvcc, venv_state(venv), cache, python_tag, mmcv_version, stack)
    plan['gpus'] = gpus
    plan['nvcc'] = nvcc
    plan['probe'] = probe
    return plan


# ----------------------------------------------------------------------------------------------- output
def describe(plan):
    """The plan in words (``setup_env.sh --plan``)."""
    lines = [f"mmcv ({plan.get('stack', 'classic')} stack): {plan['mode'] or '?'} -> {plan['action']}"]
    probe = plan.get('probe') or {}
    if probe:
        lines.append(f"torch {probe['torch']} ({'CUDA ' + probe['cuda'] if probe.get('cuda') else 'CPU-only'}; "
                     f"from {probe['source']})")
    if plan.get('gpus'):
        lines.append('visible GPUs: ' + ', '.join(f"{g['index']}: {g['name']} ({g['capability'] or '?'})"
                                                  for g in plan['gpus']))
    if plan.get('nvcc'):
        lines.append(f"nvcc {plan['nvcc']['version']} at {plan['nvcc']['path']}")
    action = plan['action']
    if action == 'stop':
        lines.append('STOP: ' + plan['message'])
    elif action == 'lite':
        lines.append(f"install {plan['lite_dist']}=={plan['mmcv']} (pure Python)")
    elif action == 'keep':
        lines.append(f"keep the installed compiled mmcv ({plan['key']})")
    elif action == 'cached':
        lines.append(f"install the cached wheel {plan['wheel']}")
    elif action == 'wheel':
        lines.append(f"install {plan['wheel']}")
    elif action == 'build':
        build_env = ' '.join(f'{k}={v}' for k, v in plan['build_env'].items())
        lines.append(f"compile {plan['source_dist']}=={plan['mmcv']} ({build_env}), cache the wheel in "
                     f"{plan['cache_dir']}/, install it")
    lines.extend('note: ' + n for n in plan['notes'])
    return '\n'.join(lines)


def shell_assignments(plan):
    """``PLAN_*`` variables for ``eval`` in setup_env.sh."""
    values = dict(PLAN_MODE=plan['mode'] or '', PLAN_ACTION=plan['action'], PLAN_WHEEL=plan['wheel'] or '',
                  PLAN_CACHE_DIR=plan['cache_dir'] or '', PLAN_KEY=plan['key'] or '', PLAN_MMCV=plan['mmcv'],
                  PLAN_LITE_DIST=plan['lite_dist'], PLAN_SOURCE_DIST=plan['source_dist'],
                  PLAN_MESSAGE=plan['message'],
                  PLAN_BUILD_ENV=' '.join(f'{k}={v}' for k, v in plan['build_env'].items()),
                  PLAN_RECORD=json.dumps(dict(mmcv=plan['mmcv'], torch=plan['torch'], cuda=plan['cuda'] or 'cpu',
                                              archs=plan['archs'], key=plan['key'], python=plan['python'],
                                              wheel=plan['wheel'])),
                  PLAN_TEXT=describe(plan))
    return ''.join(f'{k}={shlex.quote(v)}\n' for k, v in values.items())


def uv_settings(pip_config):
    """uv's arguments and environment for what ``pip config list`` printed (``pip_config``).

    uv reads no pip configuration, so the set-up hands it pip's indexes, links, certificate and timeout,
    and pip's rule of taking the best match across all indexes. A later scope's value overrides an
    earlier one's, as in pip.

    Returns:
        tuple[list[str], dict[str, str]]: the ``uv pip install`` arguments and the environment to add.
    """
    found = {}
    for line in pip_config.splitlines():  # scope.key=repr(value); a list's items on lines of their own
        match = re.match(r'^.*?\.([a-z-]+)=(.*)$', line.strip())
        if match:
            found[match[1]] = ' '.join(str(ast.literal_eval(match[2])).split())
    args = ['--index-strategy', 'unsafe-best-match']
    if found.get('index-url'):
        args += ['--index-url', found['index-url']]
    for flag, key in (('--extra-index-url', 'extra-index-url'), ('--find-links', 'find-links')):
        for value in found.get(key, '').split():
            args += [flag, value]
    env = {name: found[key] for name, key in (('SSL_CERT_FILE', 'cert'), ('UV_HTTP_TIMEOUT', 'default-timeout'))
           if found.get(key)}
    return args, env


def uv_assignments(pip_config):
    """``UV_ARGS`` and ``UV_ENV`` bash arrays for ``eval`` in setup_env.sh."""
    args, env = uv_settings(pip_config)
    return (f'UV_ARGS=({" ".join(shlex.quote(a) for a in args)})\n'
            f'UV_ENV=({" ".join(shlex.quote(f"{k}={v}") for k, v in env.items())})\n')


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--venv', default='.venv', help='the virtualenv being set up')
    parser.add_argument('--shell', action='store_true', help='print PLAN_* shell assignments instead of words')
    parser.add_argument('--uv', action='store_true',
                        help="print uv's arguments for this Python's pip configuration (UV_ARGS, UV_ENV)")
    args = parser.parse_args(argv)
    if args.uv:
        config = subprocess.run([sys.executable, '-m', 'pip', 'config', 'list'], capture_output=True, text=True)
        print(uv_assignments(config.stdout), end='')
        return 0
    try:
        plan = make_plan(args.venv)
    except ValueError as error:
        print(f'error: {error}', file=sys.stderr)
        return 2
    print(shell_assignments(plan) if args.shell else describe(plan), end='' if args.shell else '\n')
    return 0


if __name__ == '__main__':
    sys.exit(main())
