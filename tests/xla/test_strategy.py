"""The XLA runner integration (vit_plugin.xla) in this process, on torch_xla's CPU backend.

conftest.py initialises torch_xla before any test runs (pytorch/xla#4174). A two-layer MLP keeps
each run to a few seconds; every test uses its own layer width so that its graphs are new to this
process's compilation cache and the compile counts are those of a fresh run.
The training paths users run (tools/train.py --launcher xla on ViT configs) are in tests/tools/test_train_xla.py.
"""
import copy
import glob
import os.path as osp

import pytest
import torch
import torch.nn as nn
from mmengine.config import Config
from mmengine.registry import RUNNERS
from mmengine.runner import Runner
from helpers.stack import import_torch_xla_or_skip_module

torch_xla = import_torch_xla_or_skip_module()  # the classic stack pins it: a missing one fails here

pytestmark = pytest.mark.xla

from vit_plugin.xla import (XLAOptimWrapper, XLARecompileGuardHook, to_xla_config,  # noqa: E402
                            xla_optim_wrapper_cfg)
from vit_plugin.xla import runtime  # noqa: E402
from helpers.xla_runs import run_xla, toy_cfg  # noqa: E402


def history(runner, key):
    return runner.message_hub.get_scalar(f'train/{key}').data[0].tolist()


def guard_of(runner):
    return next(h for h in runner.hooks if isinstance(h, XLARecompileGuardHook))


def log_text(runner):
    return open(glob.glob(osp.join(runner.log_dir, '*.log'))[0]).read()


def test_training_matches_eager_cpu_with_deferred_logging(tmp_path):
    """Losses and clipped gradient norms of every iteration equal the eager run (1e-5), although
    the XLA run moves them to the host only every 3 iterations; the LR schedule changes every step
    and still only the warm-up compiles (2 graphs: the first update creates AdamW's state).
    Validation after every epoch (XLAValLoop) gives the eager accuracies and is not counted as
    recompilation."""
    eager = Runner.from_cfg(toy_cfg(tmp_path / 'eager', width=17, validate=True))
    eager.train()
    xla = run_xla(toy_cfg(tmp_path / 'xla', width=17, validate=True))
    assert type(xla.val_loop).__name__ == 'XLAValLoop'
    ref = eager.message_hub.get_scalar('val/acc').data[0].tolist()
    got = xla.message_hub.get_scalar('val/acc').data[0].tolist()
    assert len(got) == 3 and got == pytest.approx(ref)
    for key in ('loss', 'grad_norm'):
        ref, got = history(eager, key), history(xla, key)
        assert len(got) == len(ref) == 15
        assert max(abs(a - b) for a, b in zip(ref, got)) < 1e-5, key
    assert next(xla.model.parameters()).device.type == 'xla'
    summary = guard_of(xla).summary()
    assert summary['warmup_compiles'] == 2 and summary['steady_compiles'] == 0
    assert summary['steady_max_executions'] == 1  # one graph per step: no host read cuts it
    assert summary['compile_seconds'] > 0 and summary['steady_step_seconds'] > 0
    assert osp.isfile(osp.join(xla.log_dir, 'xla_summary.json'))
    # The checkpoint holds host tensors only, model and optimizer state alike.
    ckpt = torch.load(str(tmp_path / 'xla' / 'epoch_3.pth'), map_location='cpu', weights_only=False)
    tensors = [*ckpt['state_dict'].values(),
               *(t for s in ckpt['optimizer']['state'].values() for t in s.values())]
    assert tensors and all(t.device.type == 'cpu' for t in tensors)


def test_gradient_accumulation_matches_eager_and_compiles_once_per_phase(tmp_path):
    cfg = toy_cfg(tmp_path / 'eager', width=19, max_epochs=2)
    cfg.optim_wrapper.accumulative_counts = 2
    eager = Runner.from_cfg(cfg)
    eager.train()
    cfg = copy.deepcopy(cfg)
    cfg.work_dir, cfg.experiment_name = str(tmp_path / 'xla'), 'xla-accum'
    xla = run_xla(cfg)
    ref, got = history(eager, 'loss'), history(xla, 'loss')
    assert len(got) == 10 and max(abs(a - b) for a, b in zip(ref, got)) < 1e-5
    guard = guard_of(xla)
    # first micro-batch / accumulate+first update / accumulate+update: 3 graphs within 2k+1 = 5 its.
    assert guard.warmup_iters == 5
    assert guard.warmup_compiles == 3 and guard.steady_compiles == 0


def test_checkpoints_are_written_atomically(tmp_path, monkeypatch):
    """XLAStrategy writes ``<name>.part`` and renames it once complete: a save killed half-way (a
    pre-empted TPU VM) leaves the previous checkpoint intact and no truncated file under its name."""
    import os

    from vit_plugin.engine.checkpointing import find_resumable_checkpoint
    runner = run_xla(toy_cfg(tmp_path / 'xla', width=13, max_epochs=2))
    target = tmp_path / 'xla' / 'epoch_2.pth'
    assert target.is_file() and not glob.glob(str(tmp_path / 'xla' / '*.part'))
    before = target.read_bytes()
    torch.load(str(target), map_location='cpu', weights_only=False)  # complete

    def killed(fd):  # the process dies after writing the data, before the rename
        raise KeyboardInterrupt

    monkeypatch.setattr(os, 'fsync', killed)
    with pytest.raises(KeyboardInterrupt):
        runner.strategy.save_checkpoint(str(target))
    assert target.read_bytes() == before
    assert osp.isfile(str(target) + '.part')
    assert find_resumable_checkpoint(str(tmp_path / 'xla'), warn=None) == str(target)


def test_guard_names_item_in_step(tmp_path):
    runner = run_xla(toy_cfg(tmp_path, width=23, item_in_step=True))
    guard = guard_of(runner)
    assert guard.steady_compiles > 0 and guard.recompiled_iters
    text = log_text(runner)
    assert 'XLA recompilation at iteration' in text
    assert 'graph executions instead of 1' in text and '.item()' in text


def test_guard_names_dynamic_input_shape(tmp_path):
    """36 samples in batches of 8 without drop_last: the 4-sample last batch of each epoch is a new
    shape; the guard names it, after the loop warned about drop_last up front."""
    cfg = to_xla_config(toy_cfg(tmp_path, width=29, n=36, max_epochs=2), launcher='none')
    cfg.train_dataloader.drop_last = False
    runner = RUNNERS.build(cfg)
    runner.train()
    guard = guard_of(runner)
    assert guard.recompiled_iters[0] == 5  # the last batch of the first epoch
    text = log_text(runner)
    assert 'without drop_last' in text
    assert 'input shapes changed from ((8, 8), (8,)) to ((4, 8), (4,))' in text


def test_bf16_autocast_only_inside_the_step():
    device = runtime.device()
    layer = nn.Linear(4, 4).to(device)
    wrapper = XLAOptimWrapper(torch.optim.SGD(layer.parameters(), lr=0.1), dtype='bfloat16')
    x = torch.randn(2, 4, device=device)
    with wrapper.optim_context(layer):
        assert layer(x).dtype == torch.bfloat16
        assert torch.softmax(layer(x), -1).dtype == torch.float32  # reductions stay fp32
    assert layer(x).dtype == torch.float32
    assert layer.weight.dtype == torch.float32
    with pytest.raises(ValueError, match="'bfloat16'"):
        XLAOptimWrapper(torch.optim.SGD(layer.parameters(), lr=0.1), dtype='float16')


def test_to_xla_config_converts_loops_wrappers_and_shapes():
    cfg = Config(dict(
        train_cfg=dict(by_epoch=True, max_epochs=2, val_interval=1), val_cfg=dict(), test_cfg=None,
        optim_wrapper=dict(type='AmpOptimWrapper', loss_scale='dynamic', dtype='bfloat16',
                           optimizer=dict(type='AdamW', lr=1e-3)),
        train_dataloader=dict(batch_size=4), env_cfg=dict(dist_cfg=dict(backend='nccl')),
        model_wrapper_cfg=dict(type='MMDistributedDataParallel')))
    out = to_xla_config(cfg)
    assert out.runner_type == 'FlexibleRunner' and out.launcher == 'xla'
    assert out.strategy == dict(type='vit_plugin.XLAStrategy')
    assert out.train_cfg == dict(type='vit_plugin.XLAEpochBasedTrainLoop', max_epochs=2, val_interval=1)
    assert out.val_cfg.type == 'vit_plugin.XLAValLoop' and out.test_cfg is None
    assert out.optim_wrapper == dict(type='vit_plugin.XLAOptimWrapper', dtype='bfloat16',
                                     optimizer=dict(type='AdamW', lr=1e-3))
    assert out.train_dataloader.drop_last is True
    assert 'backend' not in out.env_cfg.dist_cfg and 'model_wrapper_cfg' not in out
    assert cfg.optim_wrapper.type == 'AmpOptimWrapper'  # the input is left untouched
    iters = to_xla_config(Config(dict(train_cfg=dict(type='IterBasedTrainLoop', max_iters=5),
                                      optim_wrapper=dict(optimizer=dict(type='SGD', lr=0.1)),
                                      train_dataloader=dict())), bf16=True)
    assert iters.train_cfg.type == 'vit_plugin.XLAIterBasedTrainLoop'
    assert iters.optim_wrapper.dtype == 'bfloat16'


@pytest.mark.parametrize('cfg, match', [
    (dict(optim_wrapper=dict(type='AmpOptimWrapper', dtype='float16', optimizer={})), "'bfloat16'"),
    (dict(optim_wrapper=dict(type='ApexOptimWrapper', optimizer={})), 'no XLA equivalent'),
    (dict(train_cfg=dict(type='MyLoop')), 'no XLA version'),
    (dict(strategy=dict(type='FSDPStrategy')), 'cannot run on XLA'),
])
def test_to_xla_config_rejects_what_cannot_run_on_xla(cfg, match):
    base = dict(train_cfg=dict(by_epoch=True, max_epochs=1), train_dataloader=dict(),
                optim_wrapper=dict(optimizer=dict(type='SGD', lr=0.1)))
    base.update(cfg)
    with pytest.raises(ValueError, match=match):
        to_xla_config(Config(base))


def test_xla_optim_wrapper_cfg_keeps_accumulation_and_clipping():
    out = xla_optim_wrapper_cfg(dict(type='OptimWrapper', accumulative_counts=4,
                                     clip_grad=dict(max_norm=1.0), optimizer=dict(type='SGD')))
    assert out == dict(type='vit_plugin.XLAOptimWrapper', accumulative_counts=4,
                       clip_grad=dict(max_norm=1.0), optimizer=dict(type='SGD'))


def test_to_cpu_moves_nested_xla_tensors_in_one_go():
    device = runtime.device()
    data = dict(a=[torch.ones(2, device=device) * 3, 'text'], b=(torch.zeros(1), 5))
    out = runtime.to_cpu(data)
    assert out['a'][0].device.type == 'cpu' and out['a'][0].tolist() == [3.0, 3.0]
    assert out['a'][1] == 'text' and out['b'][1] == 5 and out['b'][0] is data['b'][0]
