"""``tools/train.py --launcher xla`` on tiny ViT configs, against the same runs in eager CPU mode.

Every XLA run is a subprocess of the real tool with ``PJRT_DEVICE=CPU`` (torch_xla's CPU backend, one
replica); the eager CPU runs are the same tool in the test process. All train on a 64-image subset of the
digits dataset:

* a supervised (pre-training style) ViT classifier and a masked-patch-prediction ViT produce the
  eager-CPU losses at every iteration within 1e-4;
* the steady-state loop compiles nothing after warm-up, and the warm-up compiles a fixed number of
  graphs (stated in the tests);
* a checkpoint written by the XLA run resumes in eager CPU mode, and one written by the CPU run
  resumes on XLA, each continuing with the losses of the uninterrupted run.

The classifier's runs are module-scoped fixtures, each run once, with one test per claim.
"""
import glob
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

pytestmark = [pytest.mark.slow, pytest.mark.xla]

TOL = 1e-4


def cls_config(path, data_root, drop_rate=0.0, in_process=False):
    """configs/vit_demo_digits.py shrunk: a 2-block ViT, 4 iterations per epoch, 2 epochs, no random
    augmentation and by default no dropout (XLA's random generator differs from the CPU's).
    ``in_process``: for an eager run in the test process."""
    path.write_text(f"""
_base_ = [{osp.join(REPO, 'configs', 'vit_demo_digits.py')!r}]
custom_imports = dict(imports={helper_modules(['loss_recorder'], in_process)!r}, allow_failed_imports=False)
model = dict(backbone=dict(arch=dict(embed_dims=32, num_layers=2, num_heads=2, mlp_dims=64),
                           drop_rate={drop_rate}),
             head=dict(in_channels=32))
train_dataloader = dict(batch_size=16, num_workers=0, persistent_workers=False,
                        sampler=dict(type='DefaultSampler', shuffle=True, seed=0),
                        dataset=dict(data_root={data_root!r}, indices=64,
                                     pipeline={{{{_base_.test_pipeline}}}}))
val_dataloader = dict(batch_size=32, num_workers=0, dataset=dict(data_root={data_root!r}, indices=32))
test_dataloader = val_dataloader
train_cfg = dict(max_epochs=2)
default_hooks = dict(logger=dict(interval=1), checkpoint=dict(interval=1, max_keep_ckpts=5))
custom_hooks = [dict(type='LossRecorderHook')]
""")
    return str(path)


def mpp_config(path, data_root, in_process=False):
    """Masked patch prediction (3-bit mean-colour target) with a 2-block ViT, 6 iterations. ``in_process``: for
    an eager run in the test process."""
    path.write_text(f"""
_base_ = [{osp.join(REPO, 'configs', '_base_', 'default_runtime.py')!r}]
custom_imports = dict(imports={helper_modules(['loss_recorder', 'xla_test_models'], in_process)!r},
                      allow_failed_imports=False)
model = dict(
    type='HostPlanMPP',
    data_preprocessor=dict(type='SelfSupDataPreprocessor', mean=[127.5] * 3, std=[127.5] * 3,
                           to_rgb=True),
    backbone=dict(type='vit_plugin.ViT', img_size=32, patch_size=4, drop_rate=0.,
                  arch=dict(embed_dims=32, num_layers=2, num_heads=2, mlp_dims=64)),
    head=dict(type='vit_plugin.MPPHead', in_channels=32, target='mean_color_3bit', patch_size=4))
train_dataloader = dict(
    batch_size=16, num_workers=0, persistent_workers=False,
    sampler=dict(type='InfiniteSampler', shuffle=True, seed=0),
    collate_fn=dict(type='default_collate'),
    dataset=dict(type='vit_plugin.DigitsDataset', data_root={data_root!r}, split='train',
                 indices=64, pipeline=[dict(type='LoadImageFromFile'), dict(type='PackInputs')]))
optim_wrapper = dict(type='OptimWrapper', clip_grad=dict(max_norm=1.0),
                     optimizer=dict(type='AdamW', lr=1e-3, weight_decay=0.1))
param_scheduler = [dict(type='LinearLR', start_factor=0.1, by_epoch=False, begin=0, end=3)]
train_cfg = dict(type='IterBasedTrainLoop', max_iters=6)
val_cfg = None
test_cfg = None
default_hooks = dict(logger=dict(interval=1),
                     checkpoint=dict(by_epoch=False, interval=3, max_keep_ckpts=5))
log_processor = dict(by_epoch=False)
custom_hooks = [dict(type='LossRecorderHook')]
""")
    return str(path)


def train_eager(cfg, work_dir, *extra):
    """``tools/train.py`` in eager CPU mode, in the test process: its losses."""
    outcome = train_in_process(cfg, work_dir, *extra)
    assert outcome.code == 0, outcome.output[-4000:]
    return read_losses(work_dir)


def train(cfg, work_dir, *extra, timeout=900):
    """``tools/train.py`` in a subprocess (the XLA runs): its losses."""
    # The CPU backend's LLVM optimisations only make the tests' tiny graphs compile slower; the
    # numerics do not depend on them.
    # MASTER_PORT: the xla:// rendezvous store (default port 12355) must not meet another run's.
    env = dict(os.environ, OMP_NUM_THREADS='1', PJRT_DEVICE='CPU', MASTER_PORT=str(free_port()),
               PYTHONPATH=os.pathsep.join([REPO, HELPERS]),
               XLA_FLAGS='--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true')
    cmd = [sys.executable, osp.join(REPO, 'tools', 'train.py'), cfg, '--work-dir', str(work_dir), *extra]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-4000:]
    return read_losses(work_dir)


def xla_summary(work_dir):
    (path, ) = glob.glob(osp.join(str(work_dir), '*', 'xla_summary.json'))
    with open(path) as f:
        return json.load(f)


def assert_close(got, ref, iters):
    assert sorted(got) == list(iters), sorted(got)
    diffs = {i: abs(got[i] - ref[i]) for i in iters}
    assert max(diffs.values()) < TOL, diffs


# The classifier's runs (eager CPU, XLA, and each one's epoch-1 checkpoint resumed on the other device)
# are module-scoped fixtures, each run once; each test checks one claim.
@pytest.fixture(scope='module')
def cls_runs(tmp_path_factory, digits_root):
    """The classifier trained in eager CPU mode and on XLA: its configs (XLA, eager), the runs' folder and
    their losses."""
    root = tmp_path_factory.mktemp('xla_cls')
    cfg = cls_config(root / 'cls.py', digits_root)
    # In the test process each run has a config of its own name (helpers/in_process.py).
    eager_cfgs = [cls_config(root / f'cls_{name}.py', digits_root, in_process=True) for name in ('cpu', 'resume')]
    cpu = train_eager(eager_cfgs[0], root / 'cpu', '--no-validate')
    xla = train(cfg, root / 'xla', '--no-validate', '--launcher', 'xla')
    return dict(cfg=cfg, resume_cfg=eager_cfgs[1], root=root, cpu=cpu, xla=xla)


@pytest.fixture(scope='module')
def resumed_on_cpu(cls_runs):
    """The XLA checkpoint after epoch 1 resumed in eager CPU mode: its losses."""
    root = cls_runs['root']
    return train_eager(cls_runs['resume_cfg'], root / 'resume_cpu', '--no-validate', '--resume',
                       str(root / 'xla' / 'epoch_1.pth'))


@pytest.fixture(scope='module')
def resumed_on_xla(cls_runs):
    """The CPU checkpoint after epoch 1 resumed on XLA: its losses."""
    root = cls_runs['root']
    return train(cls_runs['cfg'], root / 'resume_xla', '--no-validate', '--resume', str(root / 'cpu' / 'epoch_1.pth'),
                 '--launcher', 'xla')


def test_classifier_on_xla_matches_cpu(cls_runs):
    assert_close(cls_runs['xla'], cls_runs['cpu'], range(8))


def test_classifier_on_xla_compiles_only_while_warming_up(cls_runs):
    summary = xla_summary(cls_runs['root'] / 'xla')
    # 2 step graphs (the first update creates AdamW's state); later steps reuse them.
    assert summary['warmup_compiles'] == 2 and summary['steady_compiles'] == 0, summary
    assert summary['steady_max_executions'] == 1, summary  # one graph per iteration


def test_classifier_on_xla_writes_checkpoints_of_host_tensors(cls_runs):
    xla = cls_runs['root'] / 'xla'
    assert osp.isfile(xla / 'epoch_2.pth')
    ckpt = safe_torch_load(str(xla / 'epoch_1.pth'))  # weights-only, host tensors
    assert all(t.device.type == 'cpu' for t in ckpt['state_dict'].values())


def test_xla_checkpoint_resumes_in_eager_cpu_mode(cls_runs, resumed_on_cpu):
    # Iterations 4-7 as on XLA.
    assert_close(resumed_on_cpu, cls_runs['xla'], range(4, 8))


def test_cpu_checkpoint_resumes_on_xla(cls_runs, resumed_on_xla):
    # Iterations 4-7 as on the CPU.
    assert_close(resumed_on_xla, cls_runs['cpu'], range(4, 8))


def test_resumed_xla_run_compiles_only_the_steady_state_step(cls_runs, resumed_on_xla):
    # Resumed with the optimizer state present, the run compiles only the steady-state step graph.
    resumed = xla_summary(cls_runs['root'] / 'resume_xla')
    assert resumed['warmup_compiles'] == 1 and resumed['steady_compiles'] == 0, resumed


def test_dropout_on_xla_resumes_exactly(tmp_path, digits_root):
    # The XLA device draws dropout masks from its own generator; RNGReseedHook reseeds it with the
    # host generators, so a run resumed on XLA repeats the uninterrupted run's masks and losses.
    cfg = cls_config(tmp_path / 'cls.py', digits_root, drop_rate=0.1)
    full = train(cfg, tmp_path / 'full', '--no-validate', '--launcher', 'xla')
    resumed = train(cfg, tmp_path / 'resumed', '--no-validate', '--launcher', 'xla', '--resume',
                    str(tmp_path / 'full' / 'epoch_1.pth'))
    assert sorted(resumed) == [4, 5, 6, 7]
    assert max(abs(resumed[i] - full[i]) for i in resumed) < 1e-6, (resumed, full)
    assert xla_summary(tmp_path / 'resumed')['steady_compiles'] == 0  # reseeding compiles nothing


def test_masked_patch_prediction_on_xla_matches_cpu(tmp_path, digits_root):
    cfg = mpp_config(tmp_path / 'mpp.py', digits_root)
    cpu = train_eager(mpp_config(tmp_path / 'mpp_eager.py', digits_root, in_process=True), tmp_path / 'cpu')
    xla = train(cfg, tmp_path / 'xla', '--launcher', 'xla')
    assert_close(xla, cpu, range(6))
    summary = xla_summary(tmp_path / 'xla')
    assert summary['warmup_compiles'] == 2 and summary['steady_compiles'] == 0, summary
