"""The non-finite guard: a NaN/inf step changes nothing, a streak stops the run, resume continues.

The in-process tests drive the guarded optimizer wrappers directly; the run tests go through
``tools/train.py`` (in the test process) and ``tools/dist_train.sh`` on a 2-block ViT, with NaN injected
into the loss by ``tests/helpers/nan_injection.py``.
"""
import glob
import json
import os.path as osp
import re
import subprocess

import pytest
import torch
from mmengine.optim import OptimWrapper

from helpers.common import REPO, free_port, read_losses, run_env
from helpers.in_process import helper_modules, train_in_process
from vit_plugin.engine.checkpointing import checkpoint_problem, find_resumable_checkpoint
from vit_plugin.engine.hooks import NonFiniteGuardHook
from vit_plugin.engine.optimizers import GuardedOptimWrapper


def _wrapper(accumulative_counts=1, guard=True, fused=False):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.LayerNorm(8), torch.nn.Linear(8, 1))
    optim = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1, fused=fused)
    wrapper = (GuardedOptimWrapper if guard else OptimWrapper)(optim, accumulative_counts=accumulative_counts)
    return model, wrapper


def _state(model, wrapper):
    state = {f'p.{k}': v.detach().clone() for k, v in model.named_parameters()}
    for idx, entry in wrapper.optimizer.state_dict()['state'].items():
        state.update({f's.{idx}.{k}': v.clone() for k, v in entry.items()})
    return state


def _assert_identical(a, b):
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


def _update(model, wrapper, scale=1.0, offset=0.0):
    x = torch.randn(16, 4)
    loss = model(x).pow(2).mean() * scale + offset
    wrapper.update_params(loss)


@pytest.mark.parametrize('fused', [False, True], ids=['host-decision', 'fused-on-device'])
@pytest.mark.parametrize('bad', [dict(scale=float('nan')), dict(offset=float('inf'))],
                         ids=['nan-gradients', 'inf-loss-finite-gradients'])
def test_bad_update_leaves_parameters_and_adamw_state_bit_identical(bad, fused):
    # fused: torch's fused AdamW skips on the device (found_inf), as on a GPU; otherwise the guard
    # decides on the host before the optimizer runs.
    model, wrapper = _wrapper(fused=fused)
    _update(model, wrapper)  # the optimizer state exists from here on
    before = _state(model, wrapper)
    _update(model, wrapper, **bad)
    assert wrapper.pop_skipped() is True
    _assert_identical(before, _state(model, wrapper))
    assert all(p.grad is None or not p.grad.any() for p in model.parameters())  # zeroed as usual
    _update(model, wrapper)  # training goes on: the next good update applies
    assert wrapper.pop_skipped() is False
    after = _state(model, wrapper)
    assert not torch.equal(after['s.0.step'], before['s.0.step'])
    assert all(torch.isfinite(v).all() for v in after.values())


def test_without_the_guard_one_nan_ruins_the_weights():
    # The failure the guard exists for: the same bad update, unguarded, turns the weights NaN.
    model, wrapper = _wrapper(guard=False)
    _update(model, wrapper)
    _update(model, wrapper, scale=float('nan'))
    assert not all(torch.isfinite(p).all() for p in model.parameters())


def test_gradient_accumulation_skips_the_whole_update():
    # One bad micro-batch of two: the update (at the second) is dropped, nothing half-applied.
    model, wrapper = _wrapper(accumulative_counts=2)
    wrapper.initialize_count_status(model, 0, 100)
    _update(model, wrapper)
    _update(model, wrapper)
    assert wrapper.pop_skipped() is False
    before = _state(model, wrapper)
    _update(model, wrapper, scale=float('nan'))
    assert wrapper.pop_skipped() is None  # no update at a first micro-batch
    _update(model, wrapper)
    assert wrapper.pop_skipped() is True
    _assert_identical(before, _state(model, wrapper))
    _update(model, wrapper)
    _update(model, wrapper)  # the flag does not leak into the next update
    assert wrapper.pop_skipped() is False


def test_bad_setting_names_the_key():
    with pytest.raises(ValueError, match='max_consecutive.*nonfinite_guard'):
        NonFiniteGuardHook(max_consecutive=0)
    with pytest.raises(ValueError, match='check_interval.*nonfinite_guard'):
        NonFiniteGuardHook(check_interval=0)


def test_fused_optimizer_step_reads_nothing_on_the_host(monkeypatch):
    # With a fused optimizer the verdict never leaves the device during the step: every way of
    # reading a tensor on the host fails here, and the bad update is still dropped.
    model, wrapper = _wrapper(fused=True)
    _update(model, wrapper)
    wrapper.take_verdict()
    before = _state(model, wrapper)

    def host_read(*args, **kwargs):
        raise AssertionError('host read of a tensor during the guarded step')

    with monkeypatch.context() as patch:
        for name in ('item', 'tolist', '__bool__', '__float__', '__int__'):
            patch.setattr(torch.Tensor, name, host_read)
        _update(model, wrapper, scale=float('nan'))
        verdict = wrapper.take_verdict()
    assert verdict.tolist() == [1.0, 1.0]  # [loss not finite, gradients not finite]
    _assert_identical(before, _state(model, wrapper))


# ---- The guard is the wrapper's type: plain, AMP and XLA, nothing replaced on the instance -------------

GUARDED_WRAPPERS = {
    'plain': dict(type='vit_plugin.GuardedOptimWrapper'),
    'amp-bf16': dict(type='vit_plugin.GuardedCPUAmpOptimWrapper'),
    'amp-fp16-scaler': dict(type='vit_plugin.GuardedAutocastOptimWrapper', dtype='float16', device_type='cpu',
                            loss_scale=dict(init_scale=256.)),
    # mmengine's AmpOptimWrapper with a fixed scale (which the scaler's update restores after a skip).
    'mmengine-amp-fixed-scale': dict(type='vit_plugin.GuardedAmpOptimWrapper', loss_scale=256.),
}


def _nonfinite_update(model, wrapper, bad=None):
    """One update of ``wrapper``; ``bad``: ``'nan-loss'``, or ``'inf-gradient'`` (the loss stays finite)."""
    with wrapper.optim_context(model):
        loss = model(torch.randn(16, 4)).float().pow(2).mean()
    if bad == 'nan-loss':
        loss = loss * float('nan')
    handle = model[0].weight.register_hook(lambda g: torch.full_like(g, float('inf'))) \
        if bad == 'inf-gradient' else None
    wrapper.update_params(loss)
    if handle is not None:
        handle.remove()
    return {'loss': loss.detach()}


@pytest.mark.parametrize('bad,verdict', [('nan-loss', [1.0, 1.0]), ('inf-gradient', [0.0, 1.0])],
                         ids=['nan-loss', 'inf-gradient'])
@pytest.mark.parametrize('kind', list(GUARDED_WRAPPERS))
def test_guarded_wrapper_type_skips_a_nonfinite_update_with_no_method_patched(kind, bad, verdict, monkeypatch):
    from functools import partial
    from types import SimpleNamespace

    import mmengine.optim.optimizer.amp_optimizer_wrapper as mmengine_amp
    from mmengine.logging import MessageHub
    from mmengine.optim import build_optim_wrapper

    import vit_plugin  # noqa: F401  (registers vit_plugin.*)
    # mmengine's AmpOptimWrapper refuses to build without a GPU; its loss scaler works on the CPU.
    monkeypatch.setattr(mmengine_amp, 'is_cuda_available', lambda: True)
    monkeypatch.setattr(mmengine_amp, 'GradScaler', partial(torch.amp.GradScaler, device='cpu'))
    model, _ = _wrapper(guard=False)
    wrapper = build_optim_wrapper(model, dict(GUARDED_WRAPPERS[kind],
                                              optimizer=dict(type='AdamW', lr=1e-2, weight_decay=0.1)))
    _nonfinite_update(model, wrapper)
    assert wrapper.take_verdict().tolist() == [0.0, 0.0]
    before = _state(model, wrapper)
    scale = wrapper.loss_scaler.get_scale() if wrapper.loss_scaler is not None else None
    _nonfinite_update(model, wrapper, bad)
    assert wrapper.take_verdict().tolist() == verdict  # [loss not finite, gradients not finite]
    _assert_identical(before, _state(model, wrapper))
    if scale is not None:  # the scaler lowers a dynamic scale, as for every overflow
        assert wrapper.loss_scaler.get_scale() == (scale if kind == 'mmengine-amp-fixed-scale' else scale / 2)
    # The check is the class's own backward/step: nothing was put on the instance.
    assert 'step' not in vars(wrapper) and 'backward' not in vars(wrapper)

    # The hook finds the wrapper by its type and counts: two skipped in a row, then a good update.
    hook = NonFiniteGuardHook(max_consecutive=3, check_interval=3)
    runner = SimpleNamespace(optim_wrapper=wrapper, iter=0, max_iters=10, work_dir='.',
                             message_hub=MessageHub.get_instance(f'guard_types_{kind}_{bad}'))
    hook.before_train(runner)
    for runner.iter, step_bad in enumerate([bad, bad, None]):
        hook.after_train_iter(runner, runner.iter, outputs=_nonfinite_update(model, wrapper, step_bad))
    assert hook.skipped_total == 2 and hook.consecutive == 0
    assert runner.message_hub.get_scalar('train/skipped_steps').current() == 2
    after = _state(model, wrapper)
    assert not torch.equal(after['s.0.step'], before['s.0.step'])  # the good update applied
    assert all(torch.isfinite(v).all() for v in after.values())


def test_hook_warns_about_an_unguarded_wrapper():
    # A run built without vit_plugin's runner from a config that names a plain wrapper is not guarded:
    # the hook says so, and what to name.
    import logging
    from types import SimpleNamespace

    from mmengine.logging import MMLogger
    class Records(logging.Handler):
        def emit(self, record):
            records.append(record)

    _, wrapper = _wrapper(guard=False)
    records, handler = [], Records(logging.WARNING)
    logger = MMLogger.get_current_instance()
    logger.addHandler(handler)
    try:
        NonFiniteGuardHook().before_train(SimpleNamespace(optim_wrapper=wrapper))
    finally:
        logger.removeHandler(handler)
    assert len(records) == 1 and "OptimWrapper does not skip non-finite updates; name the guarded type in the " \
        "config (e.g. optim_wrapper.type='vit_plugin.GuardedOptimWrapper')" in records[0].getMessage()


def test_guarded_optim_wrapper_cfg_follows_the_hook():
    from vit_plugin.engine.optimizers import guarded_optim_wrapper_cfg, use_mixed_precision
    from vit_plugin.xla.strategy import xla_optim_wrapper_cfg
    adamw = dict(type='AdamW', lr=1e-3)
    hook = dict(type='vit_plugin.NonFiniteGuardHook', max_consecutive=10)
    plain = dict(type='OptimWrapper', optimizer=adamw, clip_grad=dict(max_norm=1.0))
    guarded = guarded_optim_wrapper_cfg(plain, hook)
    assert guarded == dict(plain, type='vit_plugin.GuardedOptimWrapper') and plain['type'] == 'OptimWrapper'
    assert guarded_optim_wrapper_cfg(dict(optimizer=adamw), hook)['type'] == 'vit_plugin.GuardedOptimWrapper'
    assert guarded_optim_wrapper_cfg(dict(type='AmpOptimWrapper', optimizer=adamw), hook)['type'] == \
        'vit_plugin.GuardedAmpOptimWrapper'
    assert guarded_optim_wrapper_cfg(plain, None) == plain  # no hook: the config decides
    # enabled=False (the documented off switch) builds the unguarded type, whatever the config names.
    assert guarded_optim_wrapper_cfg(dict(guarded, check_grad_norm=True), dict(hook, enabled=False)) == plain
    # The hook's check_grad_norm reaches the wrapper; a wrapper that says otherwise is refused.
    assert guarded_optim_wrapper_cfg(plain, dict(hook, check_grad_norm=False))['check_grad_norm'] is False
    with pytest.raises(ValueError, match='optim_wrapper.check_grad_norm=True and default_hooks.nonfinite_guard'):
        guarded_optim_wrapper_cfg(dict(guarded, check_grad_norm=True), dict(hook, check_grad_norm=False))
    # One wrapper per module (MultiOptimWrapperConstructor); unknown types are left alone.
    multi = guarded_optim_wrapper_cfg(dict(constructor='MultiOptimWrapperConstructor', a=dict(optimizer=adamw),
                                           b=dict(type='my.OwnWrapper', optimizer=adamw)), hook)
    assert multi['a']['type'] == 'vit_plugin.GuardedOptimWrapper' and multi['b']['type'] == 'my.OwnWrapper'
    # --amp and the XLA conversion keep the guard as the config chose it.
    assert use_mixed_precision(dict(guarded), 'bf16', 'cpu')['type'] == 'vit_plugin.GuardedCPUAmpOptimWrapper'
    assert use_mixed_precision(dict(guarded), 'fp16', 'cuda')['type'] == 'vit_plugin.GuardedAutocastOptimWrapper'
    assert use_mixed_precision(dict(plain), 'bf16', 'cpu')['type'] == 'vit_plugin.CPUAmpOptimWrapper'
    xla_amp = xla_optim_wrapper_cfg(use_mixed_precision(dict(guarded), 'bf16', 'xla'))
    assert xla_amp == dict(type='vit_plugin.XLAOptimWrapper', optimizer=adamw, clip_grad=dict(max_norm=1.0),
                           dtype='bfloat16', nonfinite_guard=True)
    assert 'nonfinite_guard' not in xla_optim_wrapper_cfg(plain)
    assert guarded_optim_wrapper_cfg(xla_optim_wrapper_cfg(plain), hook)['nonfinite_guard'] is True


# ---- fp16 loss scaling: the scaler's skips are the guard's too -------------------------------------


class _InfGradientAt:
    """Makes the gradient of the first parameter inf in the backward pass of chosen iterations (1-based),
    as an fp16 overflow would; records the weights before and after each of them."""

    def __init__(self, iters):
        from mmengine.hooks import Hook
        outer = self
        self.unchanged = {}

        class Inject(Hook):
            priority = 'HIGHEST'

            def before_train_iter(self, runner, batch_idx, data_batch=None):
                outer.handle = None
                if runner.iter + 1 in iters:
                    param = next(runner.model.parameters())
                    outer.handle = param.register_hook(lambda grad: torch.full_like(grad, float('inf')))
                    outer.before = _runner_state(runner)

            def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None):
                if outer.handle is not None:
                    outer.handle.remove()
                    outer.unchanged[runner.iter + 1] = _runner_state(runner) == outer.before

        self.hook = Inject()


def _runner_state(runner):
    params = [p.detach().clone() for p in runner.model.parameters()]
    state = runner.optim_wrapper.optimizer.state_dict()['state']
    flat = [v.clone() for entry in state.values() for v in entry.values() if isinstance(v, torch.Tensor)]

    class Snapshot(list):
        def __eq__(self, other):
            return len(self) == len(other) and all(torch.equal(a, b) for a, b in zip(self, other))
    return Snapshot(params + flat)


def _fp16_runner(work_dir, inject, *, fused, guard, loss_scale=None, max_iters=14):
    import vit_plugin  # noqa: F401  (registers vit_plugin.*)
    from mmengine.model import BaseModel
    from mmengine.runner import Runner

    class Toy(BaseModel):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(4, 1)

        def forward(self, inputs, targets, mode='loss'):
            return {'loss': ((self.fc(inputs).float().squeeze(1) - targets) ** 2).mean()}

    torch.manual_seed(0)
    data = [dict(inputs=torch.randn(4), targets=torch.randn(())) for _ in range(8)]
    wrapper = dict(type='vit_plugin.GuardedAutocastOptimWrapper', dtype='float16', device_type='cpu',
                   optimizer=dict(type='AdamW', lr=0.01, fused=fused))
    if loss_scale is not None:
        wrapper['loss_scale'] = loss_scale
    return Runner(
        model=Toy(), work_dir=str(work_dir), train_cfg=dict(type='IterBasedTrainLoop', max_iters=max_iters),
        train_dataloader=dict(dataset=data, batch_size=2, sampler=dict(type='InfiniteSampler', shuffle=False),
                              collate_fn=dict(type='default_collate')),
        optim_wrapper=wrapper,
        default_hooks=dict(nonfinite_guard=dict(type='vit_plugin.NonFiniteGuardHook', **guard), logger=None,
                           checkpoint=None),
        custom_hooks=[inject.hook], default_scope='mmengine', experiment_name=f'guard_{osp.basename(work_dir)}')


@pytest.mark.parametrize('fused', [False, True], ids=['scaler-decides-on-host', 'fused-skips-on-device'])
def test_fp16_overflow_is_counted_skipped_and_stops_the_streak(tmp_path, fused):
    # A real torch.amp.GradScaler (on the CPU): overflows at iterations 3 and 7-9. The scaler skips
    # them; the guard counts all four and stops at the third in a row, when it next reads its
    # verdicts (every 4 iterations: at iteration 12).
    from vit_plugin.engine.hooks import NonFiniteTrainingError
    # (The default initial scale, 2**16, overflows this model's fp16 gradients by itself at the first
    # steps, as the scaler's start-up usually does; 256 leaves only the injected overflows.)
    inject = _InfGradientAt({3, 7, 8, 9})
    runner = _fp16_runner(tmp_path, inject, fused=fused, loss_scale=dict(init_scale=256.),
                          guard=dict(max_consecutive=3, check_interval=4))
    with pytest.raises(NonFiniteTrainingError) as info:
        runner.train()
    message = str(info.value)
    assert message.startswith('Training stopped at iteration 9 (read at iteration 12): 3 consecutive updates '
                              '(iterations 7-9)')
    assert 'the fp16 loss scaler found inf/NaN gradients' in message and '--resume' in message
    assert inject.unchanged == {3: True, 7: True, 8: True, 9: True}  # skipped: weights and AdamW state
    hook = next(h for h in runner.hooks if isinstance(h, NonFiniteGuardHook))
    assert hook.skipped_total == 4 and runner.iter == 11  # stopped in iteration 12 (0-based 11)
    assert runner.optim_wrapper.loss_scaler.get_scale() == 256. / 2**4  # lowered once per overflow


def test_fp16_scale_collapse_stops_naming_the_cause(tmp_path):
    # Overflows every other iteration never make a streak, but the scale halves each time until it is
    # below min_loss_scale: 1024 -> 512 -> 256 -> 128 -> 64 after iteration 7, read at iteration 8.
    from vit_plugin.engine.hooks import LossScaleCollapseError
    inject = _InfGradientAt({1, 3, 5, 7, 9})
    runner = _fp16_runner(tmp_path, inject, fused=True, loss_scale=dict(init_scale=1024., growth_interval=1000),
                          guard=dict(max_consecutive=3, check_interval=2, min_loss_scale=100.))
    with pytest.raises(LossScaleCollapseError, match=r'at iteration 8: the fp16 loss scale fell to 64, below '
                       r'min_loss_scale=100.*--amp bf16'):
        runner.train()


def test_nothing_is_read_before_the_check_interval(tmp_path):
    # The skip of iteration 2 is counted when the verdicts are read, at iteration 5, not before.
    seen = {}
    inject = _InfGradientAt({2})

    from mmengine.hooks import Hook

    class Watch(Hook):
        priority = 'LOWEST'

        def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None):
            hook = next(h for h in runner.hooks if isinstance(h, NonFiniteGuardHook))
            seen[runner.iter + 1] = hook.skipped_total

    runner = _fp16_runner(tmp_path, inject, fused=True, loss_scale=dict(init_scale=256.),
                          guard=dict(check_interval=5), max_iters=6)
    runner.register_hook(Watch())
    runner.train()
    assert seen == {1: 0, 2: 0, 3: 0, 4: 0, 5: 1, 6: 1}


# ---- Runs through the real tools -----------------------------------------------------------------


def guard_config(path, data_root, *, batch_size, nan=(), probe_iters=(), max_consecutive=3,
                 max_iters=12, check_interval=10, in_process=False):
    """configs/vit_demo_digits.py with a 2-block ViT, iteration-based, checkpoints every 2 steps.

    ``nan``: ``(iterations, ranks or None)`` pairs at which the loss is made NaN. ``in_process``: for a run
    in the test process (the hooks imported from ``helpers``).
    """
    modules = helper_modules(['loss_recorder', 'nan_injection'], in_process)
    hooks = [dict(type='LossRecorderHook'), dict(type='StateProbeHook', iters=list(probe_iters))]
    hooks += [dict(type='NaNInjectionHook', iters=list(iters), ranks=ranks) for iters, ranks in nan]
    path.write_text(f"""
_base_ = [{osp.join(REPO, 'configs', 'vit_demo_digits.py')!r}]
custom_imports = dict(imports={modules!r}, allow_failed_imports=False)
model = dict(backbone=dict(arch=dict(embed_dims=32, num_layers=2, num_heads=2, mlp_dims=64)),
             head=dict(in_channels=32))
train_dataloader = dict(batch_size={batch_size}, num_workers=0, persistent_workers=False,
                        dataset=dict(data_root={data_root!r}, indices=192))
val_dataloader = dict(num_workers=0, dataset=dict(data_root={data_root!r}, indices=64))
test_dataloader = val_dataloader
train_cfg = dict(_delete_=True, type='IterBasedTrainLoop', max_iters={max_iters}, val_interval=1000)
param_scheduler = [dict(type='ConstantLR', factor=1.0, by_epoch=False)]
default_hooks = dict(logger=dict(interval=1),
                     checkpoint=dict(by_epoch=False, interval=2, max_keep_ckpts=10),
                     nonfinite_guard=dict(max_consecutive={max_consecutive}, check_interval={check_interval}))
custom_hooks = {hooks!r}
""")
    return str(path)


def _run(cmd, env=None):
    return subprocess.run(cmd, env=env or run_env(), capture_output=True, text=True, timeout=300,
                          cwd=REPO)


def _probe(work_dir, rank=0):
    with open(osp.join(work_dir, f'probe_rank{rank}.json')) as f:
        return {int(k): v for k, v in json.load(f).items()}


def _weights(path):
    return torch.load(path, map_location='cpu', weights_only=False)['state_dict']


@pytest.mark.slow
def test_run_skips_a_nan_step_stops_after_a_streak_and_resumes(tmp_path, digits_root):
    work = tmp_path / 'run'
    cfg = guard_config(tmp_path / 'nan.py', digits_root, batch_size=16, nan=[((3, 7, 8, 9), None)],
                       probe_iters=(3, 7), in_process=True)
    outcome = train_in_process(cfg, work)
    # An expected outcome, explained, not a crash: exit status 3 and the message, no exception.
    assert outcome.code == 3, outcome.output[-3000:]
    out = outcome.output
    # The verdicts are read every 10 iterations (the default check_interval): the streak that reached
    # 3 at iteration 9 stops the run at iteration 10, whose update was applied but not saved.
    assert 'ERROR: Training stopped at iteration 9 (read at iteration 10): 3 consecutive updates' in out
    assert 'Traceback' not in out
    assert re.search(r'skipped the update of iteration 3 \(non-finite loss terms on this rank: '
                     r'loss=nan', out)
    probe = _probe(work)
    for it in (3, 7):
        assert probe[it]['params_identical'] and probe[it]['state_identical'], probe
        assert probe[it]['state_entries'] > 0 and probe[it]['params_finite']
    # The streak started after iter_6; iter_8 was written during it and holds the same weights;
    # nothing was written at the stop (iteration 10) or after.
    names = sorted(osp.basename(p) for p in glob.glob(str(work / 'iter_*.pth')))
    assert names == ['iter_2.pth', 'iter_4.pth', 'iter_6.pth', 'iter_8.pth'], names
    with open(work / 'last_checkpoint') as f:
        assert f.read().strip().endswith('iter_8.pth')
    w6, w8 = _weights(work / 'iter_6.pth'), _weights(work / 'iter_8.pth')
    for key in w6:
        assert torch.equal(w6[key], w8[key]), key
        assert torch.isfinite(w8[key]).all(), key

    clean = guard_config(tmp_path / 'clean.py', digits_root, batch_size=16, in_process=True)
    outcome = train_in_process(clean, work, '--resume')
    assert outcome.code == 0, outcome.output[-3000:]
    losses = read_losses(work)
    assert sorted(losses) == [8, 9, 10, 11]  # continues after iteration 8, to max_iters
    assert all(map(lambda v: v == v and abs(v) < 1e3, losses.values()))
    assert osp.exists(work / 'iter_12.pth')


@pytest.mark.slow
def test_ddp_ranks_skip_the_same_steps_and_stop_together(tmp_path, digits_root):
    # NaN on rank 1 only at iteration 3, then a streak on rank 0 only: the verdict is shared, so
    # both ranks keep identical weights and both stop (neither waits forever for the other).
    work = tmp_path / 'ddp'
    # The verdicts are read every 2 iterations, so the stop comes at the streak's end, iteration 6.
    cfg = guard_config(tmp_path / 'ddp.py', digits_root, batch_size=8, nan=[((3,), (1,)), ((5, 6), (0,))],
                       probe_iters=(3, 5), max_consecutive=2, check_interval=2)
    env = dict(run_env(), PORT=str(free_port()))
    proc = _run(['bash', osp.join(REPO, 'tools', 'dist_train.sh'), cfg, '2', '--work-dir', str(work)],
                env=env)
    assert proc.returncode != 0
    out = proc.stdout + proc.stderr
    assert out.count('Training stopped at iteration 6: 2 consecutive updates') >= 2, out[-3000:]
    for rank in (0, 1):
        probe = _probe(work, rank)
        assert probe[3]['params_identical'] and probe[3]['state_identical'], (rank, probe)
        assert probe[5]['params_identical'] and probe[5]['state_identical'], (rank, probe)
    # What --resume takes is the intact checkpoint written before the streak. (That --resume after a
    # guard stop continues from it: the single-process test above; a 2-process --resume repeating every
    # rank's losses: tests/engine/test_preemption.py.)
    with open(work / 'last_checkpoint') as f:
        assert f.read().strip().endswith('iter_4.pth')
    resumable = find_resumable_checkpoint(str(work), warn=None)
    assert osp.basename(resumable) == 'iter_4.pth' and checkpoint_problem(resumable) is None


# ---- XLA: the same guarantees without a host read per step -----------------------------------------

@pytest.mark.xla
def test_xla_guard_selects_the_old_state_on_the_device():
    import torch_xla  # noqa: F401  (pinned: fails here instead of skipping)

    from vit_plugin.xla import XLAOptimWrapper, runtime

    device = runtime.device()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 1)).to(device)
    wrapper = XLAOptimWrapper(torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1), nonfinite_guard=True)

    def step(scale):
        x = torch.randn(16, 4).to(device)
        wrapper.update_params(model(x).pow(2).mean() * scale)
        runtime.sync()
        return runtime.to_cpu(wrapper.pop_scalars())

    def state():
        cpu = runtime.to_cpu(({k: v.detach() for k, v in model.named_parameters()},
                              wrapper.optimizer.state_dict()['state']))
        flat = {f'p.{k}': v for k, v in cpu[0].items()}
        flat.update({f's.{i}.{k}': v for i, s in cpu[1].items() for k, v in s.items()})
        return flat

    first = step(float('nan'))  # before any good step: the state AdamW creates is reset to zero
    assert first['nonfinite_skipped'] == 1
    assert all(not v.any() for k, v in state().items() if k.startswith('s.'))
    step(1.0)
    before = state()
    scalars = step(float('nan'))
    _assert_identical(before, state())
    assert scalars['nonfinite_skipped'] == 2 and scalars['nonfinite_max_streak'] == 1
    scalars = step(1.0)
    assert scalars['nonfinite_skipped'] == 2
    after = state()
    assert not torch.equal(after['s.0.step'], before['s.0.step'])
    assert all(torch.isfinite(v).all() for v in after.values())
    # The step counts live on the device for the select, but checkpoints keep the configured
    # flag, so they resume on a CPU (AdamW refuses capturable=True there).
    assert all(group['capturable'] is False for group in wrapper.state_dict()['param_groups'])


@pytest.mark.xla
def test_xla_guarded_type_skips_an_inf_gradient_with_no_method_patched():
    # The config's guarded type becomes the XLA wrapper with its guard on; a finite loss with an inf
    # gradient changes nothing, and is counted on the device.
    import torch_xla  # noqa: F401  (pinned: fails here instead of skipping)
    from mmengine.optim import build_optim_wrapper

    from vit_plugin.xla import XLAOptimWrapper, runtime, xla_optim_wrapper_cfg

    device = runtime.device()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.Linear(6, 1)).to(device)
    cfg = xla_optim_wrapper_cfg(dict(type='vit_plugin.GuardedOptimWrapper', optimizer=dict(type='AdamW', lr=1e-2)))
    wrapper = build_optim_wrapper(model, cfg)
    assert isinstance(wrapper, XLAOptimWrapper) and wrapper.nonfinite_guard

    def step(inf_gradient=False):
        handle = model[0].weight.register_hook(lambda g: torch.full_like(g, float('inf'))) if inf_gradient else None
        wrapper.update_params(model(torch.randn(16, 4).to(device)).pow(2).mean())
        if handle is not None:
            handle.remove()
        runtime.sync()
        return runtime.to_cpu(wrapper.pop_scalars())

    def state():
        cpu = runtime.to_cpu(([p.detach() for p in model.parameters()], wrapper.optimizer.state_dict()['state']))
        return {**{f'p.{i}': v for i, v in enumerate(cpu[0])},
                **{f's.{i}.{k}': v for i, entry in cpu[1].items() for k, v in entry.items()}}

    step()
    before = state()
    scalars = step(inf_gradient=True)
    _assert_identical(before, state())
    assert scalars['nonfinite_skipped'] == 1 and scalars['nonfinite_max_streak'] == 1
    assert 'step' not in vars(wrapper) and 'backward' not in vars(wrapper)
    assert step()['nonfinite_skipped'] == 1
    assert not torch.equal(state()['s.0.step'], before['s.0.step'])


@pytest.mark.xla
def test_xla_run_skips_lazily_and_stops_at_the_logging_interval(tmp_path):
    # NaN at iteration 2 (skipped), then at 7, 8, 9: the streak reaches 3 at iteration 9, which
    # the host learns when the losses of iterations 7-9 arrive (logger interval 3).
    from helpers import nan_injection  # noqa: F401  (registers the hooks)
    from helpers.xla_runs import run_xla, toy_cfg

    from vit_plugin.engine.hooks import NonFiniteTrainingError

    cfg = toy_cfg(tmp_path / 'xla', width=23, log_interval=3)
    cfg.default_hooks['nonfinite_guard'] = dict(type='vit_plugin.NonFiniteGuardHook', max_consecutive=3)
    cfg.custom_hooks = [dict(type='NaNInjectionHook', iters=[2, 7, 8, 9])]
    with pytest.raises(NonFiniteTrainingError, match='stopped at iteration 9: 3 consecutive'):
        run_xla(cfg)
    names = sorted(osp.basename(p) for p in glob.glob(str(tmp_path / 'xla' / 'epoch_*.pth')))
    assert names == ['epoch_1.pth']  # 5 iterations per epoch; epoch 2 never finished
    state = torch.load(str(tmp_path / 'xla' / 'epoch_1.pth'), map_location='cpu', weights_only=False)
    assert all(torch.isfinite(v).all() for v in state['state_dict'].values())


@pytest.mark.parametrize('config', ['vit_l16_in21k.py', 'vit_b16_in21k_ft_in1k_384.py', 'vit_b16_mpp_in1k.py',
                                    'mask_rcnn_vit_b16_simplefpn_1x_coco.py'])
def test_guard_is_on_by_default(config):
    from mmengine.config import Config
    cfg = Config.fromfile(osp.join(REPO, 'configs', config))
    hook = cfg.default_hooks['nonfinite_guard']
    assert hook['type'] == 'vit_plugin.NonFiniteGuardHook' and hook.get('enabled', True)
    assert cfg.optim_wrapper['type'] == 'vit_plugin.GuardedOptimWrapper'  # the check is the wrapper's type
