"""Reaching the paper's global batch (4096 pre-training, 512 fine-tuning) on however many devices.

A config states ``global_batch_size`` (the batch the paper's learning rate and step counts refer to)
and a per-device ``train_dataloader.batch_size`` that fits in memory. :func:`apply_global_batch_size`
turns the difference into gradient accumulation: ``k = global / (world_size * per_device)`` micro-
batches per optimizer step. Everything the config counts in optimizer steps is then re-expressed in
runner iterations (one iteration = one micro-batch), so the schedule seen by the optimizer is the
paper's whatever ``k`` is:

* ``train_cfg.max_iters`` and ``train_cfg.val_interval`` (iteration-based loops);
* ``begin``/``end`` (and ``T_max``) of iteration-based parameter schedulers;
* the iteration intervals of the checkpoint and logger hooks;
* the ``interval`` of an ``EMAHook``, so the average is updated once per optimizer step and the
  paper's momentum keeps its meaning.

Set ``global_batch_size=None`` to train with the batch you have instead; ``auto_scale_lr.enable=True``
(``--auto-scale-lr``) does the same and scales the learning rate linearly to that batch.

The config records what was done (``global_batch_applied = dict(world_size=..., accumulative_counts=...)``,
also in the copy the runner writes to the work dir), so applying it again changes nothing, and the
recorded config refuses another number of processes instead of rescaling its counts twice.
"""
import os
from typing import Optional

from mmengine.config import Config

#: Config key recording the accumulation a global batch became (and for how many processes).
APPLIED_KEY = 'global_batch_applied'


def _scale(value, k):
    return value * k if isinstance(value, int) and not isinstance(value, bool) else value


def apply_global_batch_size(cfg: Config, world_size: int, logger=None) -> int:
    """Set gradient accumulation so that ``world_size`` devices reach ``cfg.global_batch_size``.

    Args:
        cfg (Config): The full config; modified in place.
        world_size (int): Number of data-parallel processes.
        logger (callable, optional): Called with one message describing the result. Defaults to None.

    Returns:
        int: The accumulation factor ``k`` (1 when the config sets no ``global_batch_size``, or
        ``auto_scale_lr.enable=True``, which drops it).

    Raises:
        ValueError: the global batch is not a multiple of ``world_size * batch_size``, or the config was
            prepared for another number of processes.
    """
    global_bs = cfg.get('global_batch_size')
    if not global_bs:
        return 1
    applied = cfg.get(APPLIED_KEY)
    if applied:
        if applied['world_size'] != world_size:
            raise ValueError(f'{APPLIED_KEY}={dict(applied)}: this config was prepared for another number of '
                             f'processes than {world_size}; train the original config, whose counts are '
                             f'not yet scaled.')
        return applied['accumulative_counts']
    if (cfg.get('auto_scale_lr') or {}).get('enable'):
        if logger is not None:
            logger(f'auto_scale_lr.enable=True: dropping global_batch_size={global_bs} (no gradient '
                   f'accumulation); the learning rate is scaled to the real batch instead.')
        cfg.global_batch_size = None
        return 1
    per_device = cfg.train_dataloader.batch_size
    per_step = per_device * world_size
    if global_bs % per_step:
        raise ValueError(
            f'global_batch_size={global_bs} is not a multiple of batch_size={per_device} x '
            f'{world_size} processes = {per_step}. Choose a per-device batch size that divides '
            f'{global_bs // world_size if global_bs % world_size == 0 else global_bs} '
            f'(`--cfg-options train_dataloader.batch_size=N`), or train with the batch you have '
            f'(`--cfg-options global_batch_size=None --auto-scale-lr`).')
    k = global_bs // per_step
    if cfg.optim_wrapper.get('accumulative_counts', 1) not in (1, k):
        raise ValueError(f'optim_wrapper.accumulative_counts={cfg.optim_wrapper.accumulative_counts} '
                         f'conflicts with global_batch_size={global_bs}; set only one of them.')
    if k > 1:
        cfg.optim_wrapper.accumulative_counts = k
        _rescale_iteration_counts(cfg, k)
    cfg[APPLIED_KEY] = dict(world_size=world_size, accumulative_counts=k)
    if logger is not None:
        logger(f'Global batch {global_bs} = {per_device} per device x {world_size} processes x {k} '
               f'accumulated micro-batches; iteration counts of the config scaled by {k}.')
    return k


def _rescale_iteration_counts(cfg: Config, k: int) -> None:
    train_cfg = cfg.get('train_cfg') or {}
    loop = str(train_cfg.get('type', '')).split('.')[-1]  # mmengine's, vit_plugin's or the XLA loop
    iter_based = loop.endswith('IterBasedTrainLoop') or train_cfg.get('by_epoch') is False
    if iter_based:
        for key in ('max_iters', 'val_interval'):
            if key in train_cfg:
                train_cfg[key] = _scale(train_cfg[key], k)
    schedulers = cfg.get('param_scheduler') or []
    schedulers = [schedulers] if isinstance(schedulers, dict) else schedulers
    for sched in schedulers:
        if not sched.get('by_epoch', True):
            for key in ('begin', 'end', 'T_max'):
                if key in sched:
                    sched[key] = _scale(sched[key], k)
    hooks = cfg.get('default_hooks') or {}
    if hooks.get('logger'):  # the logger always counts iterations
        hooks['logger']['interval'] = _scale(hooks['logger'].get('interval', 10), k)
    if hooks.get('checkpoint') and hooks['checkpoint'].get('by_epoch', True) is False:
        hooks['checkpoint']['interval'] = _scale(hooks['checkpoint'].get('interval', -1), k)
    for hook in cfg.get('custom_hooks') or []:
        if hook.get('type', '').split('.')[-1] == 'EMAHook':
            hook['interval'] = k


def world_size_from_env(launcher: str, default: Optional[int] = None) -> int:
    """Number of processes a launcher will start, read from the environment it sets up."""
    keys = {'pytorch': ('WORLD_SIZE',), 'slurm': ('SLURM_NTASKS',),
            'mpi': ('OMPI_COMM_WORLD_SIZE', 'PMI_SIZE')}.get(launcher, ())
    for key in keys:
        if os.environ.get(key):
            return int(os.environ[key])
    return default if default is not None else 1


__all__ = ['APPLIED_KEY', 'apply_global_batch_size', 'world_size_from_env']
