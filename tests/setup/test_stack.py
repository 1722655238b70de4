"""The two stacks (docs/installation.md#two-stacks): what each one holds, packaging that leaves a user's
OpenMMLab alone, the message without either, the set-up's one-stack-per-virtualenv rule, and the GPU line."""
import importlib.metadata
import json
import os
import os.path as osp
import re
import subprocess
import sys

import numpy
import pytest
import torch
from helpers.common import REPO
from helpers.stack import STACK
from packaging.requirements import Requirement
from packaging.version import Version

from vit_plugin import stack as stack_info

UPSTREAM = {'mmengine', 'mmcv', 'mmcv-lite', 'mmpretrain', 'mmdet'}
FORKS = {'onedl-mmengine', 'onedl-mmcv', 'onedl-mmpretrain', 'onedl-mmdetection'}


def _dists():
    return {re.sub(r'[-_.]+', '-', d.metadata['Name']).lower() for d in importlib.metadata.distributions()}


def test_the_environment_holds_one_whole_stack():
    """Each stack's defining versions; never a distribution of the other stack (they share import names)."""
    dists = _dists()
    if STACK == 'current':
        assert FORKS <= dists and not UPSTREAM & dists
        assert Version(torch.__version__.split('+')[0]) >= Version('2.10')
        assert Version(numpy.__version__).major == 2
        assert 'torch-xla' not in dists
    else:
        assert {'mmengine', 'mmpretrain', 'mmdet'} <= dists and {'mmcv', 'mmcv-lite'} & dists
        assert not FORKS & dists
        assert torch.__version__.startswith('2.9.')
        assert Version(numpy.__version__).major == 1
        import torch_xla  # pinned on this stack: a missing one fails here
        assert torch_xla.__version__.startswith('2.9')


def test_requirements_leave_openmmlab_to_extras():
    """install_requires names no distribution whose files could replace a fork's (or an upstream
    release's); both extras bring mmdet."""
    requirements = [Requirement(r) for r in importlib.metadata.requires('vit_plugin')]
    plain = {re.sub(r'[-_.]+', '-', r.name).lower() for r in requirements if r.marker is None}
    assert plain and not plain & (UPSTREAM | FORKS), plain

    def extra(name):
        return {re.sub(r'[-_.]+', '-', r.name).lower() for r in requirements
                if r.marker is not None and r.marker.evaluate({'extra': name})}
    assert {'onedl-mmengine', 'onedl-mmcv', 'onedl-mmpretrain', 'onedl-mmdetection'} <= extra('onedl')
    assert {'mmengine', 'mmpretrain', 'mmdet'} <= extra('openmmlab') and not extra('openmmlab') & FORKS
    assert not extra('onedl') & UPSTREAM


@pytest.mark.slow
def test_pip_install_adds_no_openmmlab_distribution(tmp_path):
    """``pip install`` of the checkout into this environment (which has a stack already), with the stack's
    own extra too, installs nothing but vit_plugin: pip resolves offline (``--no-index``), so a requirement
    the environment did not satisfy would fail the resolve instead of downloading."""
    own_extra = 'onedl' if STACK == 'current' else 'openmmlab'
    for target in (REPO, f'{REPO}[{own_extra}]'):
        report = tmp_path / 'report.json'
        proc = subprocess.run([sys.executable, '-m', 'pip', 'install', '--dry-run', '--no-index', '--no-build-isolation',
                               '--disable-pip-version-check', '--quiet', '--report', str(report), target],
                              capture_output=True, text=True, timeout=300, cwd=str(tmp_path))
        assert proc.returncode == 0, proc.stderr[-3000:]
        names = {re.sub(r'[-_.]+', '-', item['metadata']['name']).lower()
                 for item in json.loads(report.read_text())['install']}
        assert names <= {'vit-plugin'}, (target, names)


def test_import_without_openmmlab_names_both_stacks():
    """In an environment without the OpenMMLab packages (hidden here from the import system), ``import
    vit_plugin`` stops with one message naming both ways to install."""
    hide = ("import importlib.util as u; real = u.find_spec; "
            "u.find_spec = lambda n, *a: None if n.split('.')[0] in {'mmengine', 'mmcv', 'mmpretrain', 'mmdet'} "
            "else real(n, *a)\n"
            "try:\n    import vit_plugin\nexcept ImportError as e:\n    print(e)\nelse:\n    print('imported')")
    proc = subprocess.run([sys.executable, '-c', hide], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout
    assert 'mmengine, mmcv, mmpretrain, mmdet are not installed' in out, out
    assert "vit_plugin[onedl]" in out and "vit_plugin[openmmlab,lite]" in out and 'STACK=classic' in out
    assert len(out.strip().splitlines()) <= 3


def test_stack_detection_reads_the_distributions(monkeypatch):
    installed = set()
    monkeypatch.setattr(stack_info, '_installed', lambda name: name in installed)
    assert stack_info.stack_of_environment() is None
    installed.update({'onedl-mmengine', 'onedl-mmcv'})
    assert stack_info.stack_of_environment() == 'current'
    installed.add('mmcv-lite')
    assert stack_info.stack_of_environment() == 'mixed'
    installed.difference_update({'onedl-mmengine', 'onedl-mmcv'})
    assert stack_info.stack_of_environment() == 'classic'


@pytest.mark.parametrize('cuda, driver, expected', [
    ('13.2', '570.86.15', 'built for CUDA 13.2, which needs NVIDIA driver >= 580.65.06'),
    ('12.8', '470.256.02', 'built for CUDA 12.8, which needs NVIDIA driver >= 525.60.13'),
    ('13.2', '590.44.01', 'finds no usable device'),
    (None, '590.44.01', 'is a CPU-only build'),
])
def test_gpu_line_says_why_torch_cannot_use_a_present_gpu(monkeypatch, cuda, driver, expected):
    monkeypatch.setattr(torch.version, 'cuda', cuda)
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: False)
    line = stack_info.describe_gpu_access([('NVIDIA H100 80GB HBM3', driver)])
    assert line.startswith('warning: this host has 1 GPU(s) (NVIDIA H100 80GB HBM3, driver ') and expected in line
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: True)
    assert 'used by torch' in stack_info.describe_gpu_access([('NVIDIA H100 80GB HBM3', driver)])
    assert stack_info.describe_gpu_access([]) is None


def _run_setup(tmp_path, **env):
    full = dict(os.environ, VIT_PLUGIN_CACHE=str(tmp_path / 'cache'), **env)
    return subprocess.run(['bash', osp.join(REPO, 'tools', 'setup_env.sh')], env=full, capture_output=True,
                          text=True, timeout=120, cwd=REPO)


@pytest.mark.parametrize('held, asked', [('classic', 'current'), ('current', 'classic')])
def test_setup_stops_on_a_virtualenv_of_the_other_stack(tmp_path, held, asked):
    """A virtualenv made for one stack and asked for the other: the set-up stops, says how to go on, and
    changes nothing."""
    venv = tmp_path / 'venv'
    venv.mkdir()
    (venv / 'vit_plugin_stack').write_text(held + '\n')
    proc = _run_setup(tmp_path, VENV=str(venv), STACK=asked)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    out = proc.stdout + proc.stderr
    assert f'holds the {held} stack; STACK={asked} asks for the other' in out and f'rm -rf {venv}' in out
    assert 'Nothing was changed' in out
    assert sorted(p.name for p in venv.iterdir()) == ['vit_plugin_stack'] and not (tmp_path / 'cache').exists()


def test_setup_refuses_an_unknown_stack_and_a_python_the_stack_lacks(tmp_path):
    proc = _run_setup(tmp_path, VENV=str(tmp_path / 'venv'), STACK='newest')
    assert proc.returncode == 2 and 'STACK=newest: use current (the default) or classic' in proc.stderr
    # an interpreter outside the stack's range (a stand-in that answers the version check as Python 3.9)
    fake = tmp_path / 'python3.9'
    fake.write_text('#!/bin/sh\nexit 1\n')
    fake.chmod(0o755)
    for stack, versions in (('current', '3.11-3.13'), ('classic', '3.10-3.12')):
        proc = _run_setup(tmp_path, VENV=str(tmp_path / 'venv'), STACK=stack, PYTHON=str(fake))
        assert proc.returncode != 0 and f'the {stack} stack needs Python {versions}' in proc.stderr, proc.stderr
    assert not (tmp_path / 'venv').exists()


def test_the_xla_path_is_there_on_the_classic_stack_and_named_on_the_current_one():
    """The one feature only one stack has: torch_xla imports on the classic stack; on the current one the
    XLA path stops with an error that names the classic stack."""
    from vit_plugin.xla import runtime
    if STACK == 'classic':
        assert runtime.require().__name__ == 'torch_xla'
    else:
        with pytest.raises(ImportError, match=r'only the classic stack has .*`STACK=classic make setup`'):
            runtime.require()
