"""The set-up's mmcv plan (``tools/setup_plan.py``, ``tools/setup_env.sh --plan``) with fake
``nvcc`` / ``nvidia-smi`` and a faked probe, and each stack's lock per Python."""
import importlib.util
import json
import os
import os.path as osp
import subprocess
import sys

import mmcv.ops  # noqa: F401  (the pinned stack: a missing mmcv fails the module)
import pytest

from helpers.common import REPO


# ----------------------------------------------------------------------------------------------- set-up plan
@pytest.fixture(scope='module')
def plan_tool():
    # Loaded from its file, as tools/setup_env.sh runs it: it is no module of the installed package.
    spec = importlib.util.spec_from_file_location('setup_plan', osp.join(REPO, 'tools', 'setup_plan.py'))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _fake_bin(folder, name, script):
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text('#!/bin/sh\n' + script)
    path.chmod(0o755)
    return path


def _fake_nvidia_smi(folder, *gpus):
    rows = ''.join(f'{i}, GPU-{i}aaaa-bbbb, {name}, {cap}\\n' for i, (name, cap) in enumerate(gpus))
    return _fake_bin(folder, 'nvidia-smi', f'printf "{rows}"\n')


def _fake_nvcc(folder, version, archs=('7.0', '8.0', '8.6', '9.0')):
    listed = ''.join(f'compute_{a.replace(".", "")}\\n' for a in archs)
    return _fake_bin(folder, 'nvcc', 'case "$1" in --list-gpu-arch) printf "' + listed + '";; '
                     f'*) echo "Cuda compilation tools, release {version}, V{version}.1";; esac\n')


PROBE = json.dumps(dict(torch='2.9.0', cuda='12.8'))


def _plan(plan_tool, tmp_path, **env):
    """The plan for the classic stack (mmcv 2.1.0, torch 2.9.0) unless ``STACK`` says otherwise."""
    base = dict(PATH=str(tmp_path / 'bin') + os.pathsep + '/usr/bin:/bin', VIT_PLUGIN_CACHE=str(tmp_path / 'cache'),
                VIT_PLUGIN_CUDA_PROBE=PROBE, CUDA_HOME=str(tmp_path / 'no_cuda'), STACK='classic')
    base.update(env)
    return plan_tool.make_plan(str(tmp_path / 'venv'), env={k: v for k, v in base.items() if v is not None})


def test_plan_default_is_mmcv_lite_even_with_a_gpu(plan_tool, tmp_path):
    _fake_nvidia_smi(tmp_path / 'bin', ('NVIDIA H100 80GB HBM3', '9.0'))
    plan = _plan(plan_tool, tmp_path)
    assert (plan['mode'], plan['action']) == ('lite', 'lite')
    assert 'CPU and CUDA 12.8 kernels' in plan_tool.describe(plan)


def test_plan_compiled_on_a_gpu_host_with_matching_nvcc(plan_tool, tmp_path):
    _fake_nvidia_smi(tmp_path / 'bin', ('NVIDIA H100 80GB HBM3', '9.0'), ('NVIDIA A100-SXM4-40GB', '8.0'))
    nvcc = _fake_nvcc(tmp_path / 'cuda' / 'bin', '12.4')
    plan = _plan(plan_tool, tmp_path, MMCV_OPS='compiled', CUDA_HOME=str(tmp_path / 'cuda'))
    assert plan['action'] == 'build' and plan['archs'] == ['sm_80', 'sm_90']
    assert plan['key'] == 'torch-2.9.0-cu128-sm_80-sm_90'
    assert plan['cache_dir'] == str(tmp_path / 'cache' / 'wheels' / 'torch-2.9.0-cu128-sm_80-sm_90')
    assert plan['build_env'] == dict(MMCV_WITH_OPS='1', FORCE_CUDA='1', TORCH_CUDA_ARCH_LIST='8.0;9.0',
                                     CUDA_HOME=str(nvcc.parent.parent.resolve()))
    # only the GPUs CUDA_VISIBLE_DEVICES shows; TORCH_CUDA_ARCH_LIST wins over them
    assert _plan(plan_tool, tmp_path, MMCV_OPS='compiled', CUDA_HOME=str(tmp_path / 'cuda'),
                 CUDA_VISIBLE_DEVICES='1')['archs'] == ['sm_80']
    explicit = _plan(plan_tool, tmp_path, MMCV_OPS='compiled', CUDA_HOME=str(tmp_path / 'cuda'),
                     TORCH_CUDA_ARCH_LIST='8.6;9.0+PTX')
    assert explicit['key'] == 'torch-2.9.0-cu128-sm_86-sm_90+PTX'
    # an nvcc on PATH (no CUDA_HOME) is found too
    _fake_nvcc(tmp_path / 'bin', '12.8')
    assert _plan(plan_tool, tmp_path, MMCV_OPS='compiled', CUDA_HOME=None)['nvcc']['version'] == '12.8'


def test_plan_stops_on_a_gpu_host_without_a_matching_nvcc(plan_tool, tmp_path):
    _fake_nvidia_smi(tmp_path / 'bin', ('NVIDIA H100 80GB HBM3', '9.0'))
    plan = _plan(plan_tool, tmp_path, MMCV_OPS='compiled')
    assert plan['action'] == 'stop'
    assert 'no nvcc' in plan['message'] and 'CUDA 12.8' in plan['message']
    # both ways forward: an nvcc of CUDA 12.x, or a wheel built elsewhere
    assert 'CUDA toolkit 12.x' in plan['message'] and 'MMCV_WHEEL=' in plan['message']
    _fake_nvcc(tmp_path / 'cuda11' / 'bin', '11.8')
    plan = _plan(plan_tool, tmp_path, MMCV_OPS='compiled', CUDA_HOME=str(tmp_path / 'cuda11'))
    assert plan['action'] == 'stop' and 'nvcc 11.8' in plan['message'] and 'MMCV_WHEEL=' in plan['message']
    _fake_nvcc(tmp_path / 'old12' / 'bin', '12.0', archs=('8.0', '8.6'))
    plan = _plan(plan_tool, tmp_path, MMCV_OPS='compiled', CUDA_HOME=str(tmp_path / 'old12'))
    assert plan['action'] == 'stop' and 'cannot compile for sm_90' in plan['message']


def test_plan_compiled_cpu_kernels_cache_and_keep(plan_tool, tmp_path):
    plan = _plan(plan_tool, tmp_path, MMCV_OPS='compiled')  # no nvidia-smi: no GPU
    assert (plan['action'], plan['key'], plan['build_env']) == ('build', 'torch-2.9.0-cpu',
                                                                dict(MMCV_WITH_OPS='1', FORCE_CUDA='0'))
    # a GPU with a CPU-only torch: CPU kernels
    _fake_nvidia_smi(tmp_path / 'bin', ('NVIDIA L4', '8.9'))
    cpu_torch = _plan(plan_tool, tmp_path, MMCV_OPS='compiled',
                      VIT_PLUGIN_CUDA_PROBE=json.dumps(dict(torch='2.9.0', cuda=None)))
    assert cpu_torch['key'] == 'torch-2.9.0-cpu' and 'CPU-only' in plan_tool.describe(cpu_torch)
    (tmp_path / 'bin' / 'nvidia-smi').unlink()
    # a cached wheel of this key and Python is installed, not rebuilt; one of another Python is not
    py = f'cp{sys.version_info[0]}{sys.version_info[1]}'
    key_dir = tmp_path / 'cache' / 'wheels' / 'torch-2.9.0-cpu'
    key_dir.mkdir(parents=True)
    (key_dir / 'mmcv-2.1.0-cp39-cp39-linux_x86_64.whl').write_text('')
    assert _plan(plan_tool, tmp_path, MMCV_OPS='compiled')['action'] == 'build'
    wheel = key_dir / f'mmcv-2.1.0-{py}-{py}-linux_x86_64.whl'
    wheel.write_text('')
    plan = _plan(plan_tool, tmp_path, MMCV_OPS='compiled')
    assert (plan['action'], plan['wheel']) == ('cached', str(wheel))
    # the virtualenv already has it: nothing to do, and without MMCV_OPS it stays compiled
    (tmp_path / 'venv').mkdir()
    record = dict(key='torch-2.9.0-cpu', torch='2.9.0', python=py, mmcv='2.1.0', wheel=str(wheel))
    (tmp_path / 'venv' / plan_tool.RECORD).write_text(json.dumps(record))
    assert _plan(plan_tool, tmp_path)['action'] == 'keep'
    assert _plan(plan_tool, tmp_path, MMCV_OPS='compiled')['action'] == 'keep'
    assert _plan(plan_tool, tmp_path, MMCV_OPS='lite')['action'] == 'lite'
    # a wheel from MMCV_WHEEL (key unknown) stays too, until torch changes or MMCV_OPS=compiled re-decides
    (tmp_path / 'venv' / plan_tool.RECORD).write_text(json.dumps(dict(record, key=None)))
    assert _plan(plan_tool, tmp_path)['action'] == 'keep'
    assert _plan(plan_tool, tmp_path, MMCV_OPS='compiled')['action'] == 'cached'
    newer_torch = json.dumps(dict(torch='2.10.0', cuda='12.8'))
    assert _plan(plan_tool, tmp_path, VIT_PLUGIN_CUDA_PROBE=newer_torch)['action'] == 'build'


def test_plan_mmcv_wheel_and_bad_requests(plan_tool, tmp_path):
    py = f'cp{sys.version_info[0]}{sys.version_info[1]}'
    built = tmp_path / 'elsewhere' / f'mmcv-2.1.0-{py}-{py}-linux_x86_64.whl'
    built.parent.mkdir()
    built.write_text('')
    (built.parent / 'build.json').write_text(json.dumps(dict(key='torch-2.9.0-cu128-sm_90', cuda='12.8',
                                                             archs=['sm_90'])))
    plan = _plan(plan_tool, tmp_path, MMCV_WHEEL=str(built))
    assert (plan['mode'], plan['action'], plan['wheel'], plan['archs']) == ('compiled', 'wheel', str(built), ['sm_90'])
    other = built.with_name('mmcv-2.1.0-cp39-cp39-linux_x86_64.whl')
    other.write_text('')
    assert 'built for cp39' in _plan(plan_tool, tmp_path, MMCV_WHEEL=str(other))['message']
    too_new = built.with_name(f'mmcv-2.2.0-{py}-{py}-linux_x86_64.whl')
    too_new.write_text('')
    assert '< 2.2' in _plan(plan_tool, tmp_path, MMCV_WHEEL=str(too_new))['message']
    assert 'no such file' in _plan(plan_tool, tmp_path, MMCV_WHEEL=str(tmp_path / 'nope.whl'))['message']
    assert "'lite'" in _plan(plan_tool, tmp_path, MMCV_OPS='fast')['message']
    _fake_nvidia_smi(tmp_path / 'bin', ('NVIDIA H100 80GB HBM3', '9.0'))
    _fake_nvcc(tmp_path / 'cuda' / 'bin', '12.8')
    bad = _plan(plan_tool, tmp_path, MMCV_OPS='compiled', CUDA_HOME=str(tmp_path / 'cuda'), TORCH_CUDA_ARCH_LIST='sm90')
    assert bad['action'] == 'stop' and 'TORCH_CUDA_ARCH_LIST' in bad['message']


def test_plan_current_stack_builds_onedl_mmcv(plan_tool, tmp_path):
    """The current stack: onedl-mmcv without operators by default, compiled onedl-mmcv wheels on request,
    and an MMCV_WHEEL of the other stack's mmcv refused."""
    probe = json.dumps(dict(torch='2.15.0', cuda='13.2'))
    plan = _plan(plan_tool, tmp_path, STACK='current', VIT_PLUGIN_CUDA_PROBE=probe)
    assert (plan['action'], plan['lite_dist'], plan['mmcv']) == ('lite', 'onedl-mmcv', '2.3.6')
    assert 'install onedl-mmcv==2.3.6 (pure Python)' in plan_tool.describe(plan)
    compiled = _plan(plan_tool, tmp_path, STACK='current', VIT_PLUGIN_CUDA_PROBE=probe, MMCV_OPS='compiled')
    assert (compiled['action'], compiled['key'], compiled['source_dist']) == ('build', 'torch-2.15.0-cpu',
                                                                              'onedl-mmcv')
    py = f'cp{sys.version_info[0]}{sys.version_info[1]}'
    key_dir = tmp_path / 'cache' / 'wheels' / 'torch-2.15.0-cpu'
    key_dir.mkdir(parents=True)
    (key_dir / f'mmcv-2.1.0-{py}-{py}-linux_x86_64.whl').write_text('')  # the classic stack's: not this one
    assert _plan(plan_tool, tmp_path, STACK='current', VIT_PLUGIN_CUDA_PROBE=probe, MMCV_OPS='compiled')['action'] \
        == 'build'
    wheel = key_dir / f'onedl_mmcv-2.3.6-{py}-{py}-linux_x86_64.whl'
    wheel.write_text('')
    cached = _plan(plan_tool, tmp_path, STACK='current', VIT_PLUGIN_CUDA_PROBE=probe, MMCV_OPS='compiled')
    assert (cached['action'], cached['wheel']) == ('cached', str(wheel))
    upstream = key_dir / f'mmcv-2.1.0-{py}-{py}-linux_x86_64.whl'
    refused = _plan(plan_tool, tmp_path, STACK='current', VIT_PLUGIN_CUDA_PROBE=probe, MMCV_WHEEL=str(upstream))
    assert refused['action'] == 'stop' and 'not a compiled onedl-mmcv wheel' in refused['message']
    assert _plan(plan_tool, tmp_path, STACK='current', VIT_PLUGIN_CUDA_PROBE=probe, MMCV_WHEEL=str(wheel))['action'] \
        == 'wheel'
    with pytest.raises(ValueError, match='STACK=future'):
        _plan(plan_tool, tmp_path, STACK='future')


@pytest.mark.parametrize('stack, pythons, expected', [
    ('classic', ((3, 10), (3, 11), (3, 12)), dict(scipy=['1.15.3', '1.17.1', '1.17.1'],
                                                 setuptools=['65.5.0', '65.5.0', '80.8.0'],
                                                 torch=['2.9.0'] * 3, numpy=['1.26.4'] * 3)),
    ('current', ((3, 11), (3, 12), (3, 13)), dict(scipy=['1.17.1', '1.18.1', '1.18.1'], torch=['2.15.0'] * 3,
                                                 numpy=['2.2.6'] * 3, **{'onedl-mmcv': ['2.3.6'] * 3})),
])
def test_lock_resolves_per_python(plan_tool, stack, pythons, expected):
    """Each stack's lock: one version per package for each Python the stack supports."""
    pins = {v: plan_tool.read_lock(plan_tool.lock_path(stack), python_version=v) for v in pythons}
    for name, versions in expected.items():
        assert [pins[v][name] for v in pythons] == versions, name
    if stack == 'classic':
        assert all(pins[v]['mmcv-lite'] == '2.1.0' and pins[v]['torch-xla'] == '2.9.0' for v in pins)
        assert 'mmcv' not in pins[(3, 11)] and 'tomli' in pins[(3, 10)] and 'tomli' not in pins[(3, 11)]
    else:  # the forks only: an upstream distribution would put its files over a fork's
        assert not {'mmcv', 'mmcv-lite', 'mmengine', 'mmpretrain', 'mmdet', 'torch-xla'} & set(pins[(3, 12)])


def _setup_env(tmp_path, *args, **env):
    full = dict(os.environ, VENV=str(tmp_path / 'venv'), VIT_PLUGIN_CACHE=str(tmp_path / 'cache'),
                VIT_PLUGIN_CUDA_PROBE=PROBE, CUDA_HOME=str(tmp_path / 'no_cuda'), STACK='classic',
                PATH=str(tmp_path / 'bin') + os.pathsep + os.environ['PATH'])
    full.update(env)
    return subprocess.run(['bash', osp.join(REPO, 'tools', 'setup_env.sh'), *args], env=full, capture_output=True,
                          text=True, timeout=120)


def test_setup_env_plan_changes_nothing_and_the_gpu_stop_comes_first(tmp_path):
    """``setup_env.sh --plan`` prints the decision and creates nothing; a real run that must stop (a GPU,
    no matching nvcc) stops before creating the virtualenv."""
    _fake_nvidia_smi(tmp_path / 'bin', ('NVIDIA H100 80GB HBM3', '9.0'))
    _fake_nvcc(tmp_path / 'cuda' / 'bin', '12.8')
    proc = _setup_env(tmp_path, '--plan', MMCV_OPS='compiled', CUDA_HOME=str(tmp_path / 'cuda'))
    assert proc.returncode == 0, proc.stderr
    assert 'compiled -> build' in proc.stdout and 'TORCH_CUDA_ARCH_LIST=9.0' in proc.stdout
    assert 'visible GPUs: 0: NVIDIA H100 80GB HBM3 (9.0)' in proc.stdout
    proc = _setup_env(tmp_path, '--plan')
    assert proc.returncode == 0 and 'lite -> lite' in proc.stdout
    stop = _setup_env(tmp_path, MMCV_OPS='compiled')
    assert stop.returncode == 1 and 'STOP: ' in stop.stderr and 'stopped before changing anything' in stop.stdout
    assert not (tmp_path / 'venv').exists() and not (tmp_path / 'cache').exists()


def test_uv_gets_the_indexes_links_certificate_and_timeout_of_pips_configuration(plan_tool, tmp_path):
    """uv reads no pip configuration: the set-up hands it what pip is configured with, a later scope
    overriding an earlier one, and pip's best match across indexes."""
    args, env = plan_tool.uv_settings(
        "global.index-url='https://mirror.example/simple'\n"
        "global.extra-index-url='file:///opt/a/simple file:///opt/b/simple'\n"
        "global.find-links='/opt/old'\n"
        "global.cert='/etc/ca.pem'\n"
        ":env:.find-links='/opt/wheels'\n"
        ":env:.default-timeout='180'\n")
    assert args == ['--index-strategy', 'unsafe-best-match', '--index-url', 'https://mirror.example/simple',
                    '--extra-index-url', 'file:///opt/a/simple', '--extra-index-url', 'file:///opt/b/simple',
                    '--find-links', '/opt/wheels']
    assert env == {'SSL_CERT_FILE': '/etc/ca.pem', 'UV_HTTP_TIMEOUT': '180'}
    # what this Python's pip prints for a configuration file, through the command the set-up evals
    config = tmp_path / 'pip.conf'
    config.write_text('[global]\nextra-index-url = file:///opt/x/simple\n    file:///opt/y/simple\n')
    clean = {k: v for k, v in os.environ.items() if not k.startswith('PIP_')}
    out = subprocess.run(['bash', '-c', f'eval "$({sys.executable} tools/setup_plan.py --uv)"; '
                          'printf "%s\\n" "${UV_ARGS[@]}" --env "${UV_ENV[@]}"'],
                         env=dict(clean, PIP_CONFIG_FILE=str(config)), cwd=REPO, capture_output=True, text=True)
    words = out.stdout.split('\n')
    assert words[:2] == ['--index-strategy', 'unsafe-best-match'], out.stdout + out.stderr
    indexes = [words[i + 1] for i, w in enumerate(words) if w == '--extra-index-url']
    assert indexes == ['file:///opt/x/simple', 'file:///opt/y/simple']  # the file's, over the user's
