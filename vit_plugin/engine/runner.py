"""vit_plugin's runners: the config names them, and every entry point trains the same run.

``runner_type='vit_plugin.Runner'`` (``configs/_base_/default_runtime.py`` and the detection recipe
``configs/_base_/recipes/det_vit_b16.py`` set it) builds mmengine's ``Runner``, and
``runner_type='vit_plugin.FlexibleRunner'`` mmengine's ``FlexibleRunner`` (a ``strategy``: FSDP2, XLA),
after :func:`prepare_run` has applied to the config what a vit_plugin run needs, once the number of
processes is known. mmengine's, mmpretrain's and mmdet's ``tools/train.py`` build a config's
``runner_type`` through ``RUNNERS.build(cfg)``, so they train what ``tools/train.py`` of this repository
trains; so does ``RUNNERS.build(cfg)`` in a script. mmengine's ``Runner.from_cfg`` builds mmengine's
class and ignores ``runner_type``. Each step is switched by a config key (defaults in brackets):

* ``global_batch_size`` [None: off]: gradient accumulation and iteration counts rescaled for the
  number of processes (:func:`~vit_plugin.engine.global_batch.apply_global_batch_size`, which records
  ``global_batch_applied`` in the config, so nothing is applied twice);
* ``device_defaults`` [True]: fused optimizers, TF32 and pinned loader memory on GPUs
  (:mod:`~vit_plugin.engine.device_defaults`); on hosts without GPUs, multi-process runs over Gloo
  (mmengine's own set-up insists on CUDA); on GPU hosts, no more processes per node than GPUs;
* ``preemption`` [True]: ``vit_plugin.PreemptionHook`` and atomic checkpoints
  (:func:`~vit_plugin.engine.preemption.use_preemption_safe_hooks`), and ``resume=True`` without
  ``load_from`` resumes from the newest *intact* checkpoint of the work dir;
* ``input_norm_check`` [True]: ``vit_plugin.InputNormCheckHook``.

Under the FSDP2 strategy an ``EMAHook`` becomes ``vit_plugin.ShardedEMAHook`` (same settings). See
docs/configs.md#one-runner-named-by-the-config.
"""
import copy
import logging
import os
from typing import Callable, Optional

import torch
from mmengine.config import Config
from mmengine.dist import infer_launcher
from mmengine.hooks import Hook
from mmengine.logging import print_log
from mmengine.runner import FlexibleRunner as MMEngineFlexibleRunner
from mmengine.runner import Runner as MMEngineRunner

from vit_plugin.registry import HOOKS, RUNNERS

from .checkpointing import find_resumable_checkpoint
from .device_defaults import apply_device_defaults
from .global_batch import APPLIED_KEY, apply_global_batch_size, world_size_from_env
from .hooks import use_input_norm_check
from .preemption import release_signals, use_preemption_safe_hooks
from .slurm import slurm_env


class RunSetupError(ValueError):
    """The config or the launch cannot run as given; the message says what to change."""


#: The config keys that switch the steps of :func:`prepare_run`, with their defaults.
SWITCHES = dict(device_defaults=True, preemption=True, input_norm_check=True)
#: Launchers whose processes form a process group.
DISTRIBUTED_LAUNCHERS = ('pytorch', 'slurm', 'mpi')


def is_rank_zero() -> bool:
    """Whether this process is rank 0: of its process group, or before one exists, of its launch (read
    from the launcher's environment)."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank() == 0
    return int(os.environ.get('RANK', os.environ.get('SLURM_PROCID', '0'))) == 0


def _type_name(cfg_dict) -> str:
    return str((cfg_dict or {}).get('type', '')).split('.')[-1]


def run_launcher(cfg: Config, flexible: bool = False) -> str:
    """The config's ``launcher``; without one ``'none'``, or for FlexibleRunner (which infers it the
    same way) the launcher the environment shows."""
    launcher = cfg.get('launcher')
    if launcher is None:
        launcher = infer_launcher() if flexible else 'none'
    return launcher


def run_device(cfg: Config) -> str:
    """The kind of device the run trains on: ``'xla'`` (the XLA strategy or launcher), ``'cuda'``
    where a GPU is visible, else ``'cpu'``."""
    if cfg.get('launcher') == 'xla' or _type_name(cfg.get('strategy')) == 'XLAStrategy':
        return 'xla'
    return 'cuda' if torch.cuda.is_available() else 'cpu'


def run_world_size(launcher: str) -> int:
    """Number of processes of the run: the process group's size if this process has joined one, else
    what the launcher's environment says (``WORLD_SIZE``, ``SLURM_NTASKS``, ...; 1 for ``'none'``)."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_world_size()
    return world_size_from_env(launcher)


# ----------------------------------------------------------------------------------------- the steps
def use_global_batch(cfg: Config, launcher: str, device: str, log: Callable[[str], None]) -> int:
    """``global_batch_size`` for this run's processes; returns the accumulation factor (1: none).

    On XLA devices the replicas are counted inside the processes ``torch_xla`` starts, so there
    :func:`vit_plugin.xla.launch_training` applies it before the runner is built.
    """
    if not cfg.get('global_batch_size') or not cfg.get('train_dataloader'):
        return 1
    applied = cfg.get(APPLIED_KEY)
    if device == 'xla' and applied:  # counted by the XLA launcher (one SPMD process may drive many devices)
        return applied['accumulative_counts']
    if device == 'xla' and launcher == 'xla':
        raise RunSetupError(f'global_batch_size={cfg.global_batch_size} on XLA: the replicas are counted in '
                            'the processes torch_xla starts; train with `tools/train.py CONFIG --launcher xla` '
                            '(vit_plugin.xla.launch_training), which applies it there.')
    try:
        return apply_global_batch_size(cfg, run_world_size(launcher), logger=log)
    except ValueError as err:
        raise RunSetupError(str(err)) from None


def check_processes_per_gpu(launcher: str) -> None:
    """Refuse, saying what to do, a node with more processes than GPUs: NCCL cannot run two ranks on one
    GPU."""
    per_node = os.environ.get('LOCAL_WORLD_SIZE') if launcher == 'pytorch' else \
        os.environ.get('SLURM_NTASKS_PER_NODE') if launcher == 'slurm' else None
    gpus = torch.cuda.device_count()
    if per_node and per_node.isdigit() and int(per_node) > gpus:
        raise RunSetupError(f'launcher={launcher!r}: {per_node} processes on this node but {gpus} visible '
                            f'GPU(s); NCCL needs one GPU per process. Start at most {gpus} per node, or hide '
                            f'the GPUs (CUDA_VISIBLE_DEVICES=) to train on the CPU with Gloo.')


def join_process_group_without_gpus(cfg: Config, launcher: str, flexible: bool) -> None:
    """A multi-process run on a host without GPUs: the Gloo backend, mmengine's DDP wrapper without a
    CUDA device id (unless a strategy wraps the model), and for torchrun / SLURM the process group joined
    here (mmengine's ``init_dist`` calls ``torch.cuda.set_device``); the runner then skips its own."""
    env_cfg = cfg.get('env_cfg') or {}
    dist_cfg = env_cfg.get('dist_cfg') or {}
    dist_cfg['backend'] = 'gloo'
    env_cfg['dist_cfg'] = dist_cfg
    cfg.env_cfg = env_cfg
    if not flexible and cfg.get('model_wrapper_cfg') is None:
        cfg.model_wrapper_cfg = dict(type='MMDistributedDataParallel', device_ids=None, broadcast_buffers=False,
                                     find_unused_parameters=cfg.get('find_unused_parameters', False))
    if launcher in ('pytorch', 'slurm') and not torch.distributed.is_initialized():
        if launcher == 'slurm':
            try:
                os.environ.update(slurm_env())
            except KeyError as err:
                raise RunSetupError(str(err).strip('"\'')) from None
        torch.distributed.init_process_group(backend='gloo')


def use_device_defaults(cfg: Config, launcher: str, device: str, flexible: bool,
                        log: Callable[[str], None]) -> None:
    """The defaults of :mod:`~vit_plugin.engine.device_defaults` for ``device``, and the process group
    of a multi-process run that fits the host (Gloo without GPUs, one process per GPU with them)."""
    for message in apply_device_defaults(cfg, device):
        log(message)
    if launcher in DISTRIBUTED_LAUNCHERS:
        if device == 'cpu':
            join_process_group_without_gpus(cfg, launcher, flexible)
        elif device == 'cuda':
            check_processes_per_gpu(launcher)


def resume_from_intact_checkpoint(cfg: Config, log: Callable[[str], None]) -> None:
    """``resume=True`` without ``load_from``: the newest intact checkpoint of the work dir (a truncated
    or corrupt one is skipped with a warning); a work dir without checkpoints starts from the beginning.

    Raises:
        RunSetupError: the work dir has checkpoints, none of them intact.
    """
    if not cfg.get('resume') or cfg.get('load_from') is not None or not cfg.get('work_dir'):
        return
    try:
        found = find_resumable_checkpoint(cfg.work_dir, warn=log)
    except FileNotFoundError as err:
        raise RunSetupError(str(err)) from None
    if found is None:
        log(f'resume: no checkpoint in {cfg.work_dir}; training starts from the beginning.')
    cfg.resume = found is not None
    cfg.load_from = found


def shard_ema_hooks(cfg: Config) -> None:
    """Under FSDP2 an ``EMAHook`` becomes ``vit_plugin.ShardedEMAHook`` with the same settings: mmengine's
    deep-copies the model, which FSDP2 modules refuse; the sharded one averages each process's shards in
    place (same checkpoints)."""
    for hook in cfg.get('custom_hooks') or []:
        if _type_name(hook) == 'EMAHook':
            hook['type'] = 'vit_plugin.ShardedEMAHook'


def prepare_run(cfg: Config, flexible: bool = False, device: Optional[str] = None) -> Config:
    """Apply to ``cfg`` (in place) what vit_plugin's runners apply before building the run.

    Args:
        cfg (Config): The full config, as ``Runner.from_cfg`` takes it.
        flexible (bool): Built as a FlexibleRunner (a ``strategy`` wraps the model). Defaults to False.
        device (str, optional): ``'cuda'``, ``'cpu'`` or ``'xla'``. Defaults to None: :func:`run_device`.

    Returns:
        Config: ``cfg``.

    Raises:
        RunSetupError: what the config or the launch must change (e.g. a global batch that is not a
            multiple of the processes' batch).
    """
    log = print if is_rank_zero() else (lambda message: None)
    launcher = run_launcher(cfg, flexible)
    device = device or run_device(cfg)
    switches = {key: cfg.get(key, default) for key, default in SWITCHES.items()}
    use_global_batch(cfg, launcher, device, log)
    if switches['device_defaults']:
        use_device_defaults(cfg, launcher, device, flexible, log)
    if switches['preemption']:
        use_preemption_safe_hooks(cfg)
        resume_from_intact_checkpoint(cfg, log)
    if switches['input_norm_check']:
        use_input_norm_check(cfg)
    if _type_name(cfg.get('strategy')) == 'FSDP2Strategy':
        shard_ema_hooks(cfg)
    return cfg


# ---------------------------------------------------------------------------------------- the runners
#: The config key in which vit_plugin's runners record that they built the run.
BUILT_BY_KEY = 'built_by_runner'


@HOOKS.register_module()
class RunnerCheckHook(Hook):
    """Speaks up when a config names one of vit_plugin's runners but another one built the run.

    mmengine's ``Runner.from_cfg(cfg)`` (a classmethod of mmengine's own class) ignores ``runner_type``,
    so :func:`prepare_run` never ran. vit_plugin's runtimes list this hook: before the first iteration
    it stops a run whose ``global_batch_size`` was thereby dropped (it would train the paper's schedule
    with the per-device batch), and warns about the other steps missing.
    """
    priority = 'VERY_HIGH'

    def before_run(self, runner) -> None:
        cfg = getattr(runner, 'cfg', None) or {}
        wanted = str(cfg.get('runner_type', ''))
        if not wanted.startswith('vit_plugin.') or cfg.get(BUILT_BY_KEY) == wanted:
            return
        built = type(runner).__name__
        if cfg.get('global_batch_size') and not cfg.get(APPLIED_KEY):
            raise RunSetupError(f'The config names runner_type={wanted!r} and global_batch_size='
                                f'{cfg.global_batch_size}, but {built}.from_cfg built the run without them. Build '
                                f'it with mmengine.registry.RUNNERS.build(cfg).')
        print_log(f'The config names runner_type={wanted!r}, but {built}.from_cfg built the run: its device '
                  f'defaults and pre-emption safety are off. RUNNERS.build(cfg) builds it as configured.',
                  logger='current', level=logging.WARNING)


@RUNNERS.register_module()
class Runner(MMEngineRunner):
    """mmengine's ``Runner``, built from a config prepared by :func:`prepare_run`.

    Name it in a config with ``runner_type='vit_plugin.Runner'``; build it with ``RUNNERS.build(cfg)``
    (what mmengine's, mmpretrain's and mmdet's tools do) or ``Runner.from_cfg(cfg)`` of this class.
    """

    @classmethod
    def from_cfg(cls, cfg: Config) -> 'Runner':
        cfg = copy.deepcopy(cfg)
        if cfg.get('strategy'):
            raise RunSetupError(f'strategy={_type_name(cfg.strategy)!r} needs a FlexibleRunner: set '
                                "runner_type='vit_plugin.FlexibleRunner' (a Runner has no strategy).")
        cfg = prepare_run(cfg)
        cfg[BUILT_BY_KEY] = 'vit_plugin.Runner'
        return super().from_cfg(cfg)

    def train(self):
        try:
            return super().train()
        finally:
            release_signals(self)  # also when the run ends in an exception, which has no after_run


@RUNNERS.register_module()
class FlexibleRunner(MMEngineFlexibleRunner):
    """mmengine's ``FlexibleRunner`` (the config's ``strategy`` wraps the model: FSDP2, XLA), built from
    a config prepared by :func:`prepare_run`; ``runner_type='vit_plugin.FlexibleRunner'``."""

    @classmethod
    def from_cfg(cls, cfg: Config) -> 'FlexibleRunner':
        cfg = prepare_run(copy.deepcopy(cfg), flexible=True)
        cfg[BUILT_BY_KEY] = 'vit_plugin.FlexibleRunner'
        return super().from_cfg(cfg)

    def train(self):
        try:
            return super().train()
        finally:
            release_signals(self)


__all__ = ['FlexibleRunner', 'Runner', 'RunnerCheckHook', 'RunSetupError', 'SWITCHES', 'check_processes_per_gpu', 'is_rank_zero',
           'prepare_run', 'run_device', 'run_launcher', 'run_world_size']
