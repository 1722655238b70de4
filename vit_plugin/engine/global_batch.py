"""The paper's global batch on any number of devices, by gradient accumulation with rescaled counts.

See docs/configs.md#training-and-testing ("Global batch and gradient accumulation").
"""
import os
from typing import Callable, Optional

from mmengine.config import Config

from .config_edits import ConfigEdits, type_name

#: Config key of the record the plan writes: the processes and the accumulation the global batch became.
RECORD_KEY = 'run_plan'
#: Alias of :data:`RECORD_KEY`, read the same way.
APPLIED_KEY = 'global_batch_applied'


def recorded_plan(cfg) -> Optional[dict]:
    """The ``run_plan`` (or ``global_batch_applied``) record of a config already planned, else None."""
    record = cfg.get(RECORD_KEY) or cfg.get(APPLIED_KEY)
    return dict(record) if record else None


def _scale(value, k):
    return value * k if isinstance(value, int) and not isinstance(value, bool) else value


def plan_global_batch(edits: ConfigEdits, world_size: Optional[int], log: Callable[[str], None]) -> int:
    """The global-batch step of the run plan on ``edits``; returns the accumulation factor ``k`` (1 if off).

    ``world_size`` is None where this process cannot know it (XLA replicas). Raises ValueError when the
    global batch is no multiple of ``world_size * batch_size``, the config was planned for another number
    of processes, or that number is unknown.
    """
    global_bs = edits.get('global_batch_size')
    if not global_bs or not edits.get('train_dataloader'):
        return 1
    record = recorded_plan(edits.data)
    if record:
        if world_size is not None and record['world_size'] != world_size:
            raise ValueError(f'{RECORD_KEY}={record}: this config was prepared for another number of processes '
                             f'than {world_size}; train the original config, whose counts are not yet scaled.')
        return record['accumulative_counts']
    if (edits.get('auto_scale_lr') or {}).get('enable'):
        log(f'auto_scale_lr.enable=True: dropping global_batch_size={global_bs} (no gradient '
            f'accumulation); the learning rate is scaled to the real batch instead.')
        edits.set('global_batch_size', None)
        return 1
    if world_size is None:
        raise ValueError(f'global_batch_size={global_bs} on XLA: the replicas are counted in the processes '
                         'torch_xla starts; train with `tools/train.py CONFIG --launcher xla` '
                         '(vit_plugin.xla.launch_training), which plans the run there.')
    per_device = edits.get('train_dataloader.batch_size')
    per_step = per_device * world_size
    if global_bs % per_step:
        raise ValueError(
            f'global_batch_size={global_bs} is not a multiple of batch_size={per_device} x '
            f'{world_size} processes = {per_step}. Choose a per-device batch size that divides '
            f'{global_bs // world_size if global_bs % world_size == 0 else global_bs} '
            f'(`--cfg-options train_dataloader.batch_size=N`), or train with the batch you have '
            f'(`--cfg-options global_batch_size=None --auto-scale-lr`).')
    k = global_bs // per_step
    counts = edits.get('optim_wrapper.accumulative_counts', 1)
    if counts not in (1, k):
        raise ValueError(f'optim_wrapper.accumulative_counts={counts} '
                         f'conflicts with global_batch_size={global_bs}; set only one of them.')
    if k > 1:
        edits.set('optim_wrapper.accumulative_counts', k)
        _rescale_iteration_counts(edits, k)
    edits.set(RECORD_KEY, dict(world_size=world_size, accumulative_counts=k))
    log(f'Global batch {global_bs} = {per_device} per device x {world_size} processes x {k} '
        f'accumulated micro-batches; iteration counts of the config scaled by {k}.')
    return k


def apply_global_batch_size(cfg: Config, world_size: int, logger=None) -> int:
    """Apply :func:`plan_global_batch` alone to ``cfg`` in place; returns ``k``, passes messages to ``logger``."""
    edits = ConfigEdits(cfg)
    k = plan_global_batch(edits, world_size, logger or (lambda message: None))
    ConfigEdits.apply(cfg, edits.changes())
    return k


def _rescale_iteration_counts(edits: ConfigEdits, k: int) -> None:
    train_cfg = edits.get('train_cfg') or {}
    loop = type_name(train_cfg)  # mmengine's, vit_plugin's or the XLA loop
    if loop.endswith('IterBasedTrainLoop') or train_cfg.get('by_epoch') is False:
        for key in ('max_iters', 'val_interval'):
            if key in train_cfg:
                edits.set(('train_cfg', key), _scale(train_cfg[key], k))
    schedulers = edits.get('param_scheduler') or []
    if isinstance(schedulers, dict):
        schedulers, prefix = [schedulers], lambda i: ('param_scheduler',)
    else:
        prefix = lambda i: ('param_scheduler', i)  # noqa: E731
    for i, sched in enumerate(schedulers):
        if not sched.get('by_epoch', True):
            for key in ('begin', 'end', 'T_max'):
                if key in sched:
                    edits.set(prefix(i) + (key,), _scale(sched[key], k))
    hooks = edits.get('default_hooks') or {}
    if hooks.get('logger'):  # the logger always counts iterations
        edits.set('default_hooks.logger.interval', _scale(hooks['logger'].get('interval', 10), k))
    if hooks.get('checkpoint') and hooks['checkpoint'].get('by_epoch', True) is False:
        edits.set('default_hooks.checkpoint.interval', _scale(hooks['checkpoint'].get('interval', -1), k))
    for i, hook in enumerate(edits.get('custom_hooks') or []):
        if type_name(hook) == 'EMAHook':
            edits.set(('custom_hooks', i, 'interval'), k)


def world_size_from_env(launcher: str, default: Optional[int] = None) -> int:
    """Number of processes a launcher will start, read from the environment it sets up."""
    keys = {'pytorch': ('WORLD_SIZE',), 'slurm': ('SLURM_NTASKS',),
            'mpi': ('OMPI_COMM_WORLD_SIZE', 'PMI_SIZE')}.get(launcher, ())
    for key in keys:
        if os.environ.get(key):
            return int(os.environ[key])
    return default if default is not None else 1


__all__ = ['APPLIED_KEY', 'RECORD_KEY', 'apply_global_batch_size', 'plan_global_batch', 'recorded_plan',
           'world_size_from_env']
