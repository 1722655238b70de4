"""``vit_plugin.Runner``: the config names the runner, and every entry point trains the same run.

One toy classification config (vit_plugin's runtime, digits) and one toy detection config (mmdet's
runtime and the detection recipe, generated shapes) state a global batch 4 times the per-device batch
of a single process, so the runner must accumulate 4 micro-batches and count 4 iterations per step.
Each entry point trains its config once (module fixture):

* classification: our ``tools/train.py``, mmpretrain's ``tools/train.py`` from the installed package
  and ``RUNNERS.build(cfg).train()`` as a script calls it;
* detection: our ``tools/train.py`` and mmdet's ``tools/train.py`` from the installed package.

mmpretrain's and mmdet's tools run as subprocesses (the config alone brings vit_plugin to them); ours
and the script run in the test process meanwhile, with one thread like the subprocesses.

Each run records (helpers/run_recorder.py) its runner, its hooks, its accumulation and iteration
count, and the loss and learning rate of every iteration. Also here: what the runner does to a
config with its switches on and off, that it applies a global batch once, and that every option of
``tools/train.py`` is a set of config keys that ``--cfg-options`` sets the same way.
"""
import importlib.util
import os.path as osp
import subprocess
import sys

import pytest
from mmengine.config import Config
from mmengine.registry import RUNNERS

from helpers.common import REPO, run_env
from helpers.in_process import train_in_process
from helpers.run_recorder import read_record
from helpers.subprocess_like import like_a_subprocess

pytestmark = pytest.mark.slow

K = 4  # micro-batches per optimizer step: global batch 32 = 8 per device x 1 process x 4 (detection: 8 = 2 x 4)
CLS_STEPS, DET_STEPS = 3, 2  # optimizer steps of each config


def packaged_tool(package):
    """The ``tools/train.py`` an OpenMMLab package ships (what ``mim train`` runs)."""
    path = osp.join(osp.dirname(importlib.util.find_spec(package).origin), '.mim', 'tools', 'train.py')
    assert osp.isfile(path), f'{package} ships no tools/train.py at {path}'
    return path


def cls_config(path, data_root):
    path.write_text(f"""
_base_ = [{osp.join(REPO, 'configs', 'vit_demo_digits.py')!r}]
custom_imports = dict(imports=['vit_plugin', 'run_recorder'], allow_failed_imports=False)
model = dict(backbone=dict(arch=dict(embed_dims=32, num_layers=2, num_heads=2, mlp_dims=64), drop_rate=0.1),
             head=dict(in_channels=32))
train_dataloader = dict(batch_size=8, num_workers=0, persistent_workers=False,
                        sampler=dict(type='DefaultSampler', shuffle=True, seed=0),
                        dataset=dict(data_root={data_root!r}, indices=96, pipeline={{{{_base_.test_pipeline}}}}))
val_dataloader = val_cfg = val_evaluator = None
global_batch_size = 32
# counted in optimizer steps: warm-up for 1, cosine decay over 2
param_scheduler = [dict(type='LinearLR', start_factor=0.1, by_epoch=False, begin=0, end=1),
                   dict(type='CosineAnnealingLR', eta_min=1e-5, by_epoch=False, begin=1, end={CLS_STEPS})]
train_cfg = dict(_delete_=True, type='IterBasedTrainLoop', max_iters={CLS_STEPS})
default_hooks = dict(logger=dict(interval=1), checkpoint=dict(by_epoch=False, interval=1000))
log_processor = dict(by_epoch=False)
custom_hooks = [dict(type='RunRecorderHook')]
""")
    return str(path)


def det_config(path, data_root):
    path.write_text(f"""
_base_ = [{osp.join(REPO, 'configs', 'mask_rcnn_vit_tiny_simplefpn_shapes.py')!r}]
custom_imports = dict(imports=['vit_plugin', 'run_recorder'], allow_failed_imports=False)
train_dataloader = dict(batch_size=2, dataset=dict(data_root={data_root!r}, num_images=dict(train=16)))
val_dataloader = val_cfg = val_evaluator = None
global_batch_size = 8
param_scheduler = [dict(type='LinearLR', start_factor=0.1, by_epoch=False, begin=0, end={DET_STEPS})]
train_cfg = dict(_delete_=True, type='IterBasedTrainLoop', max_iters={DET_STEPS})
default_hooks = dict(logger=dict(interval=1), checkpoint=dict(by_epoch=False, interval=1000))
log_processor = dict(by_epoch=False)
randomness = dict(seed=0)  # mmdet's runtime draws a seed otherwise
custom_hooks = [dict(type='RunRecorderHook')]
""")
    return str(path)


def run_script(cfg, work):
    """``RUNNERS.build(cfg).train()``, as a script or a notebook builds a runner from a config."""
    config = Config.fromfile(cfg)
    config.work_dir = str(work)
    RUNNERS.build(config).train()


@pytest.fixture(scope='module')
def records(tmp_path_factory, digits_root):
    """Every entry point's run of its config: entry point -> record. mmpretrain's and mmdet's tools run as
    subprocesses, which import vit_plugin only through the config's ``custom_imports``; our tool and the
    script run in this process meanwhile, one after the other, each with a config file of its own name."""
    from vit_plugin.datasets.shapes_coco import make_shapes_coco

    root = tmp_path_factory.mktemp('entry_points')
    shapes = str(root / 'shapes') + '/'
    make_shapes_coco(shapes, dict(train=16))  # before the runs, which would each write it
    configs = {name: cls_config(root / f'{name}.py', digits_root) for name in ('ours', 'mmpretrain', 'script')}
    configs.update({name: det_config(root / f'{name}.py', shapes) for name in ('ours_det', 'mmdet')})
    procs = {}
    for name in ('mmpretrain', 'mmdet'):
        work = str(root / name)
        procs[name] = subprocess.Popen([sys.executable, packaged_tool(name), configs[name], '--work-dir', work],
                                       env=run_env(), cwd=REPO, text=True, stdout=subprocess.PIPE,
                                       stderr=subprocess.PIPE)
    found = {}
    with like_a_subprocess('run_recorder'):
        for name in ('ours', 'ours_det'):
            outcome = train_in_process(configs[name], root / name)
            assert outcome.code == 0, f'{name}: {outcome.output[-4000:]}'
            found[name] = read_record(root / name)
        run_script(configs['script'], root / 'script')
        found['script'] = read_record(root / 'script')
    for name, proc in procs.items():
        out, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, f'{name}: {out[-2000:]}{err[-4000:]}'
        found[name] = read_record(root / name)
    return found


def same_run(a, b):
    """Two records of the same run: equal hooks and counts, learning rates and losses (to 1e-6)."""
    assert {k: v for k, v in a.items() if k not in ('losses', 'lrs')} == \
        {k: v for k, v in b.items() if k not in ('losses', 'lrs')}
    assert a['lrs'] == pytest.approx(b['lrs'], rel=0, abs=1e-12)
    assert sorted(a['losses']) == sorted(b['losses'])
    assert a['losses'] == pytest.approx(b['losses'], rel=0, abs=1e-6)


def test_every_entry_point_accumulates_to_the_global_batch(records):
    counts = {name: (r['runner'], r['accumulative_counts'], r['max_iters'], len(r['losses']))
              for name, r in records.items()}
    cls, det = ('Runner', K, K * CLS_STEPS, K * CLS_STEPS), ('Runner', K, K * DET_STEPS, K * DET_STEPS)
    assert counts == dict(ours=cls, mmpretrain=cls, script=cls, ours_det=det, mmdet=det)


def test_the_schedule_counts_optimizer_steps(records):
    """The warm-up of 1 optimizer step reaches the base learning rate after K iterations."""
    lrs = records['ours']['lrs']
    assert lrs[K] == pytest.approx(2e-3) and lrs[K - 1] < 2e-3 and lrs[K + 1] < 2e-3


def test_mmpretrains_tool_trains_what_ours_trains(records):
    same_run(records['mmpretrain'], records['ours'])


def test_runners_build_in_a_script_trains_what_ours_trains(records):
    same_run(records['script'], records['ours'])


def test_mmdets_tool_trains_what_ours_trains(records):
    same_run(records['mmdet'], records['ours_det'])


def test_a_config_on_mmdets_runtime_gets_the_runners_hooks(records):
    hooks = records['mmdet']['hooks']
    assert {'PreemptionHook', 'AtomicCheckpointHook', 'InputNormCheckHook'} <= set(hooks)
    assert 'CheckpointHook' not in hooks  # mmdet's runtime names it: made atomic


# ------------------------------------------------------------------------- the config, in this process
def mmpretrain_runtime_config(**keys):
    """A config on mmpretrain's own runtime, with a model, a loader and a schedule, and ``keys``."""
    cfg = Config.fromfile(osp.join(REPO, 'configs', 'vit_demo_digits.py'))
    upstream = Config.fromstring("_base_ = ['mmpretrain::_base_/default_runtime.py']", '.py')
    for key in ('default_hooks', 'env_cfg', 'runner_type', 'device_defaults', 'preemption', 'input_norm_check'):
        cfg.pop(key, None)
    cfg.merge_from_dict(dict(default_hooks=upstream.default_hooks, env_cfg=upstream.env_cfg, work_dir='/nonexistent',
                             **keys))
    cfg.env_cfg.tf32 = False  # torch's own setting: what the runner sets on a CUDA device leaves this process as it was
    return cfg


def test_switched_off_the_runner_leaves_the_config_as_it_is():
    from vit_plugin.engine.runner import prepare_run
    cfg = mmpretrain_runtime_config(global_batch_size=None, device_defaults=False, preemption=False,
                                    input_norm_check=False, resume=True)
    before = cfg.to_dict()
    assert prepare_run(cfg, device='cuda').to_dict() == before


def test_switched_on_the_runner_makes_an_upstream_runtime_preemption_safe():
    from vit_plugin.engine.runner import prepare_run
    cfg = prepare_run(mmpretrain_runtime_config(), device='cuda')
    hooks = cfg.default_hooks
    assert hooks.checkpoint.type == 'vit_plugin.AtomicCheckpointHook' and hooks.checkpoint.interval == 1
    assert hooks.preemption.type == 'vit_plugin.PreemptionHook'
    assert hooks.input_norm_check.type == 'vit_plugin.InputNormCheckHook'
    assert cfg.optim_wrapper.optimizer.fused is True and cfg.train_dataloader.pin_memory is True


def test_a_global_batch_is_applied_once_and_only_for_its_process_count(monkeypatch):
    from vit_plugin.engine.runner import RunSetupError, prepare_run
    monkeypatch.setenv('OMPI_COMM_WORLD_SIZE', '8')  # launcher 'mpi' on this host: Gloo, no process group joined
    cfg = Config.fromfile(osp.join(REPO, 'configs', 'vit_l16_in21k_ft_in1k_384.py'))
    cfg.merge_from_dict(dict(launcher='mpi', train_dataloader=dict(batch_size=16)))
    prepare_run(prepare_run(cfg, device='cpu'), device='cpu')  # 512 = 16 x 8 processes x 4
    assert cfg.optim_wrapper.accumulative_counts == 4 and cfg.train_cfg.max_iters == 4 * 20000
    assert cfg.run_plan == dict(world_size=8, accumulative_counts=4)
    monkeypatch.setenv('OMPI_COMM_WORLD_SIZE', '4')
    with pytest.raises(RunSetupError, match='prepared for another number of processes than 4'):
        prepare_run(cfg, device='cpu')


def test_xla_builds_vit_plugins_flexible_runner_with_the_batch_it_applied():
    from vit_plugin.engine.global_batch import apply_global_batch_size
    from vit_plugin.engine.runner import prepare_run
    from vit_plugin.xla import to_xla_config
    cfg = Config.fromfile(osp.join(REPO, 'configs', 'vit_demo_digits.py'))
    cfg.merge_from_dict(dict(global_batch_size=256, train_cfg=dict(max_epochs=2, val_interval=1)))
    apply_global_batch_size(cfg, 2)  # what each XLA process does once it knows the replicas
    xla = to_xla_config(cfg)
    assert xla.runner_type == 'vit_plugin.FlexibleRunner' and xla.launcher == 'xla'
    prepare_run(xla, flexible=True)
    assert xla.optim_wrapper.accumulative_counts == 2
    assert xla.default_hooks.preemption.type == 'vit_plugin.PreemptionHook'


# ------------------------------------------------------------------- tools/train.py: options are keys
# Each option of tools/train.py and the --cfg-options that set the same keys (docs/configs.md).
FLAG_KEYS = [
    (['--work-dir', 'out'], ['work_dir=out']),
    (['--no-validate'], ['val_cfg=None', 'val_dataloader=None', 'val_evaluator=None']),
    (['--no-pin-memory'], ['train_dataloader.pin_memory=False', 'val_dataloader.pin_memory=False',
                           'test_dataloader.pin_memory=False']),
    (['--no-tf32'], ['env_cfg.tf32=False']),
    (['--compile'], ['compile=True']),
    (['--auto-scale-lr'], ['auto_scale_lr.enable=True']),
    (['--resume'], ['resume=True', 'load_from=None']),
    (['--resume', 'ckpt.pth'], ['resume=True', 'load_from=ckpt.pth']),
    (['--fsdp'], ['runner_type=vit_plugin.FlexibleRunner', 'strategy.type=vit_plugin.FSDP2Strategy']),
    (['--amp', 'bf16'], ['optim_wrapper.type=vit_plugin.GuardedCPUAmpOptimWrapper', 'optim_wrapper.dtype=bfloat16']),
    (['--launcher', 'pytorch'], ['launcher=pytorch']),
]


@pytest.mark.parametrize('flags, keys', FLAG_KEYS, ids=[' '.join(flags) for flags, _ in FLAG_KEYS])
def test_each_option_of_tools_train_is_config_keys(flags, keys, monkeypatch):
    import vit_plugin.cli.launch as launch
    from vit_plugin.cli import train
    monkeypatch.setattr(launch, 'training_device', lambda launcher: 'cpu')  # --amp's choice on this host
    config = osp.join(REPO, 'configs', 'vit_demo_digits.py')

    def merged(*argv):
        args = train.parse_args([config, *argv])
        return train.merge_args(Config.fromfile(config), args).to_dict()

    by_flag, by_keys = merged(*flags), merged('--cfg-options', *keys)
    assert by_flag == by_keys and by_flag != merged()


def test_mmengines_from_cfg_of_a_config_naming_our_runner_stops_before_training(tmp_path, digits_root):
    """mmengine's Runner.from_cfg ignores runner_type: the run would silently lack the global batch."""
    from mmengine.runner import Runner as MMEngineRunner
    from vit_plugin.engine.runner import RunSetupError
    cfg = Config.fromfile(osp.join(REPO, 'configs', 'vit_demo_digits.py'))
    cfg.merge_from_dict(dict(work_dir=str(tmp_path), global_batch_size=128,
                             train_dataloader=dict(num_workers=0, dataset=dict(data_root=digits_root)),
                             val_dataloader=dict(num_workers=0, dataset=dict(data_root=digits_root))))
    with pytest.raises(RunSetupError, match=r"runner_type='vit_plugin.Runner' and global_batch_size=128.*RUNNERS"):
        MMEngineRunner.from_cfg(cfg).train()


def test_the_runner_formats_its_config_once_and_freezes_the_heap_while_it_runs(tmp_path, digits_root, monkeypatch):
    """mmengine formats the runner's config (yapf) for the log, the work dir's copy, the run's metadata and
    every checkpoint: ours formats it once, and again only when the content changes. The heap is frozen
    while train() and val() run, and given back as it was."""
    import gc

    import torch
    from mmengine.hooks import Hook
    cfg = Config.fromfile(osp.join(REPO, 'configs', 'vit_demo_digits.py'))
    cfg.merge_from_dict(dict(
        work_dir=str(tmp_path), model=dict(backbone=dict(arch=dict(embed_dims=32, num_layers=1, num_heads=2,
                                                                   mlp_dims=64)), head=dict(in_channels=32)),
        train_dataloader=dict(batch_size=32, num_workers=0, persistent_workers=False,
                              dataset=dict(data_root=digits_root, indices=64)),
        val_dataloader=dict(num_workers=0, dataset=dict(data_root=digits_root, indices=32)),
        train_cfg=dict(max_epochs=2, val_interval=1), default_hooks=dict(checkpoint=dict(interval=1))))
    cfg.test_dataloader = cfg.val_dataloader
    formats = []
    mmengine_text = Config.pretty_text.fget
    monkeypatch.setattr(Config, 'pretty_text', property(lambda self: formats.append(1) or mmengine_text(self)))

    class FreezeProbe(Hook):
        def __init__(self):
            self.seen = []

        def before_train(self, runner):
            self.seen.append(('train', gc.get_freeze_count()))

        def before_val(self, runner):
            self.seen.append(('val', gc.get_freeze_count()))

    freeze_count = gc.get_freeze_count()
    runner = RUNNERS.build(cfg)
    probe = FreezeProbe()
    runner.register_hook(probe)
    runner.train()
    runner.val()
    assert gc.get_freeze_count() == freeze_count
    assert [loop for loop, _ in probe.seen] == ['train', 'val', 'val', 'val'] and all(n > 0 for _, n in probe.seen)
    assert len(formats) == 1, len(formats)  # the log, the work dir's copy, the run's metadata, 2 checkpoints

    text = runner.cfg.pretty_text
    assert text == mmengine_text(runner.cfg)  # mmengine's own formatting of the same content
    assert (tmp_path / 'vit_demo_digits.py').read_text() == text
    for epoch in (1, 2):
        ckpt = torch.load(tmp_path / f'epoch_{epoch}.pth', map_location='cpu', weights_only=False)
        assert ckpt['meta']['cfg'] == text
    runner.cfg.train_cfg.max_epochs = 3
    assert 'max_epochs=3' in runner.cfg.pretty_text and len(formats) == 2
