"""XLA SPMD (``tools/train.py --launcher xla --xla-spmd``): one process, four virtual CPU devices.

The run splits the batch and every parameter that divides evenly over a 4-device mesh (FSDPv2). It
must give the losses of a single-device eager CPU run, hold a quarter of each sharded weight (and of
its AdamW moments) per device, compile nothing after warm-up, and write ordinary full-size
checkpoints that resume in eager mode. With layer scan (``--xla-layer-scan``) the blocks run as one
compiled loop, alone or under SPMD, with the same losses. The eager CPU runs train in the test process;
the XLA runs are subprocesses of the real tool.
"""
import json
import os
import os.path as osp
import subprocess
import sys

import pytest
from helpers.stack import import_torch_xla_or_skip_module

torch_xla = import_torch_xla_or_skip_module()  # the classic stack pins it: a missing one fails here
from helpers.common import HELPERS, REPO, free_port, read_losses
from helpers.in_process import helper_modules, train_in_process

from vit_plugin.checkpoint.safe_load import safe_torch_load
from vit_plugin.models.backbones.vit import ViT
from vit_plugin.xla.scan import check_scannable
from vit_plugin.xla.spmd import AXIS, param_partition_spec

DEVICES = 4
TOL = 1e-4


def test_partition_rule_splits_the_largest_even_dimension():
    # ViT-B/16 tensors over 4 devices
    assert param_partition_spec((2304, 768), 4) == (AXIS, None)         # qkv: its 2,304 rows
    assert param_partition_spec((768, 3072), 4) == (None, AXIS)         # fc2: its 3,072 columns
    assert param_partition_spec((768, 3, 16, 16), 4) == (AXIS, None, None, None)  # patch embedding
    assert param_partition_spec((1, 197, 768), 4) == (None, None, AXIS)  # 197 does not divide
    assert param_partition_spec((768, ), 4) == (AXIS, )                  # norms and biases too
    assert param_partition_spec((10, 7), 4) is None                      # nothing divides: replicated
    assert param_partition_spec((3, ), 4) is None
    assert param_partition_spec((64, 64), 4) == (AXIS, None)             # a tie: the first dimension
    assert param_partition_spec((768, ), 1) is None                      # one device: nothing to split


def _config(path, data_root, in_process=False):
    """configs/vit_demo_digits.py shrunk: a 2-block ViT of width 32, batch 16, 2 epochs of 4 iterations,
    no random augmentation or dropout (XLA's generator differs from the CPU's). ``in_process``: for an
    eager run in the test process (the hooks imported from ``helpers``)."""
    path.write_text(f"""
_base_ = [{osp.join(REPO, 'configs', 'vit_demo_digits.py')!r}]
custom_imports = dict(imports={helper_modules(['loss_recorder', 'spmd_probe'], in_process)!r},
                      allow_failed_imports=False)
model = dict(backbone=dict(arch=dict(embed_dims=32, num_layers=2, num_heads=2, mlp_dims=64), drop_rate=0.),
             head=dict(in_channels=32))
train_dataloader = dict(batch_size=16, num_workers=0, persistent_workers=False,
                        sampler=dict(type='DefaultSampler', shuffle=True, seed=0),
                        dataset=dict(data_root={data_root!r}, indices=64, pipeline={{{{_base_.test_pipeline}}}}))
train_cfg = dict(max_epochs=2)
default_hooks = dict(logger=dict(interval=1), checkpoint=dict(interval=1, max_keep_ckpts=5))
custom_hooks = [dict(type='LossRecorderHook'), dict(type='SpmdProbeHook')]
""")
    return str(path)


def _train(cfg, work_dir, *extra, spmd=False):
    env = dict(os.environ, OMP_NUM_THREADS='1', PJRT_DEVICE='CPU', MASTER_PORT=str(free_port()),
               PYTHONPATH=os.pathsep.join([REPO, HELPERS]),
               XLA_FLAGS='--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true')
    if spmd:
        env['CPU_NUM_DEVICES'] = str(DEVICES)
        extra = (*extra, '--launcher', 'xla', '--xla-spmd')
    else:
        env.pop('PJRT_DEVICE')  # no SPMD: the probe hook finds no mesh and stays idle
    cmd = [sys.executable, osp.join(REPO, 'tools', 'train.py'), cfg, '--work-dir', str(work_dir), '--no-validate',
           *extra]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-4000:]
    return read_losses(work_dir), proc.stdout + proc.stderr


def _train_eager(cfg, work_dir, *extra):
    """An eager CPU run of ``tools/train.py`` in the test process (the probe hook finds no mesh and stays
    idle): its losses."""
    outcome = train_in_process(cfg, work_dir, '--no-validate', *extra)
    assert outcome.code == 0, outcome.output[-4000:]
    return read_losses(work_dir)


@pytest.fixture(scope='module')
def eager_run(tmp_path_factory, digits_root):
    """The reference both XLA runs below are held to, trained once: (config of the XLA runs, losses of a
    single-device eager CPU run, config of a later eager run: each in-process run has its own name)."""
    root = tmp_path_factory.mktemp('eager')
    eager = _train_eager(_config(root / 'eager.py', digits_root, in_process=True), root / 'eager')
    return _config(root / 'cls.py', digits_root), eager, _config(root / 'resume.py', digits_root, in_process=True)


@pytest.mark.slow
@pytest.mark.xla
def test_spmd_over_four_devices_matches_eager_shards_and_resumes(tmp_path, eager_run):
    cfg, eager, eager_cfg = eager_run
    sharded, log = _train(cfg, tmp_path / 'spmd', spmd=True)
    assert sorted(sharded) == list(range(8))
    diffs = {i: abs(sharded[i] - eager[i]) for i in range(8)}
    assert max(diffs.values()) < TOL, diffs
    assert f'XLA SPMD: {DEVICES} devices' in log

    with open(tmp_path / 'spmd' / 'spmd_probe.json') as f:
        probe = json.load(f)
    assert probe['mesh'] == DEVICES
    qkv = probe['params']['backbone.blocks.0.attn.qkv.weight']
    assert qkv['full'] == [96, 32] and qkv['local'] == [24, 32] and qkv['spec'] == [AXIS, None]
    assert 'devices=[4,1]' in qkv['sharding']
    split = replicated = 0
    for name, p in probe['params'].items():
        if p['spec'] is None:
            assert p['local'] == p['full'], name
            replicated += 1
            continue
        dim = p['spec'].index(AXIS)
        assert p['local'][dim] * DEVICES == p['full'][dim], name  # each device: a quarter
        assert probe['exp_avg_local'][name] == p['local'], name  # AdamW's moments split alike
        split += 1
    assert split > 0.9 * (split + replicated), (split, replicated)

    # nothing compiles after warm-up
    (summary_path, ) = [osp.join(d, 'xla_summary.json') for d, _, files in os.walk(tmp_path / 'spmd')
                        if 'xla_summary.json' in files]
    with open(summary_path) as f:
        summary = json.load(f)
    assert summary['steady_compiles'] == 0, summary

    # checkpoints hold full tensors on the host, and resume in eager mode with the SPMD run's losses
    ckpt = safe_torch_load(str(tmp_path / 'spmd' / 'epoch_1.pth'))
    assert list(ckpt['state_dict']['backbone.blocks.0.attn.qkv.weight'].shape) == [96, 32]
    resumed = _train_eager(eager_cfg, tmp_path / 'resumed', '--resume', str(tmp_path / 'spmd' / 'epoch_1.pth'))
    assert sorted(resumed) == [4, 5, 6, 7]
    assert max(abs(resumed[i] - sharded[i]) for i in resumed) < TOL, (resumed, sharded)


def test_layer_scan_refuses_blocks_it_cannot_run_as_one():
    tiny = dict(arch=dict(embed_dims=16, num_layers=3, num_heads=2, mlp_dims=32), img_size=16, patch_size=4)
    check_scannable(ViT(**tiny))  # identical deterministic blocks: fine
    check_scannable(ViT(**tiny, with_cp=True))
    with pytest.raises(ValueError, match=r'dropout or stochastic depth.*drop_rate=0'):
        check_scannable(ViT(**tiny, drop_rate=0.1))
    with pytest.raises(ValueError, match='drop_path_rate=0'):
        check_scannable(ViT(**tiny, drop_path_rate=0.1))
    with pytest.raises(ValueError, match=r'only the last block \(2\) leaves a scan'):
        check_scannable(ViT(**tiny, out_indices=(1, 2)))
    with pytest.raises(ValueError, match='block 2 of backbone is configured differently'):
        check_scannable(ViT(**tiny, window_size=2, window_block_indices=(0, 1)))
    # the paper's ImageNet-21k recipe (dropout 0.1) is refused by tools/train.py before any process starts
    refused = train_in_process(osp.join(REPO, 'configs', 'vit_b16_in21k.py'), '/nonexistent', '--launcher', 'xla',
                               '--xla-layer-scan')
    assert refused.stop is not None and 'model.backbone.drop_rate=0' in str(refused.code), refused


def test_layer_scan_under_spmd_without_jax_is_refused_before_training(monkeypatch, tmp_path, digits_root):
    from mmengine.config import Config

    from vit_plugin.xla import scan, to_xla_config
    real = scan.importlib.util.find_spec
    monkeypatch.setattr(scan.importlib.util, 'find_spec', lambda name, *a: None if name == 'jax' else real(name, *a))
    cfg = Config.fromfile(_config(tmp_path / 'cls.py', digits_root), import_custom_modules=False)
    to_xla_config(cfg, spmd=True)  # each alone is fine
    to_xla_config(cfg, layer_scan=True)
    with pytest.raises(ValueError, match='layer scan under SPMD needs the jax package'):
        to_xla_config(cfg, spmd=True, layer_scan=True)


@pytest.mark.slow
@pytest.mark.xla
def test_layer_scan_matches_the_unrolled_model_and_recomputes_with_cp(tmp_path, eager_run):
    cfg, eager, _ = eager_run
    scanned, log = _train(cfg, tmp_path / 'scan', '--launcher', 'xla', '--xla-layer-scan')
    assert 'XLA layer scan: backbone run their blocks as one compiled loop' in log
    recomputed, log = _train(cfg, tmp_path / 'scan_cp', '--launcher', 'xla', '--xla-layer-scan', '--cfg-options',
                             'model.backbone.with_cp=True')
    for run in (scanned, recomputed):
        assert sorted(run) == list(range(8))
        assert max(abs(run[i] - eager[i]) for i in range(8)) < TOL, (run, eager)
    for work_dir in ('scan', 'scan_cp'):
        (summary_path, ) = [osp.join(d, 'xla_summary.json') for d, _, files in os.walk(tmp_path / work_dir)
                            if 'xla_summary.json' in files]
        with open(summary_path) as f:
            assert json.load(f)['steady_compiles'] == 0
