"""What ``tools/train.py`` and ``tools/test.py`` do between reading the config and running the runner.

One function per concern, each taking the config (modified in place) and the value of its
command-line option, so that a new option is one function here and one line in the ``merge_args``
of :mod:`vit_plugin.apis.train` (or :mod:`vit_plugin.apis.test`):

* configuration from the command line: :func:`merge_cfg_options`, :func:`set_work_dir`,
  :func:`use_amp` (with the rule of ``--amp`` without a value in :func:`amp_precision`),
  :func:`use_auto_scale_lr`, :func:`set_resume` (:func:`resume_latest` finds the newest intact
  checkpoint), :func:`skip_validation`, :func:`disable_pin_memory`, :func:`use_fsdp`,
  :func:`use_compile`, :func:`use_device_defaults` (fused optimizers, TF32 and pinned memory on GPUs),
  and from the engine ``use_preemption_safe_hooks`` and ``use_input_norm_check``;
* processes and strategy: :func:`setup_launcher` (DDP, FSDP2, XLA with SPMD and layer scan, SLURM
  tasks on hosts without GPUs), :func:`set_global_batch`;
* the run: :func:`build_runner`, :func:`run_training`, and :func:`exit_on_expected_errors`, which turns the
  errors a user can fix into one message and an exit status.
"""
import gc
import logging
import os
import os.path as osp
import sys
from contextlib import contextmanager
from typing import Any, Callable, Optional

import torch
from mmengine.config import Config
from mmengine.registry import RUNNERS
from mmengine.runner import Runner

from vit_plugin.datasets.checked import DataRootNotFoundError
from vit_plugin.engine.checkpointing import find_resumable_checkpoint
from vit_plugin.engine.device_defaults import apply_device_defaults
from vit_plugin.engine.global_batch import apply_global_batch_size, world_size_from_env
from vit_plugin.engine.hooks import NonFiniteTrainingError
from vit_plugin.engine.optimizers import resolve_precision, use_mixed_precision
from vit_plugin.engine.preemption import TrainingPreempted
from vit_plugin.engine.slurm import slurm_env
from vit_plugin.xla import launch_training, to_xla_config

#: Launchers of ``tools/train.py``; ``tools/test.py`` takes all but ``xla``.
LAUNCHERS = ('none', 'pytorch', 'slurm', 'mpi', 'xla')
#: Exit status when the data root is missing (the message names the path).
DATA_NOT_FOUND_EXIT_CODE = 2
#: Exit status of a run stopped by vit_plugin.NonFiniteGuardHook (too many NaN/inf steps in a row).
NONFINITE_EXIT_CODE = 3


def is_rank_zero() -> bool:
    """Whether this process is rank 0 of its launch, read from the launcher's environment (valid before
    any process group exists)."""
    return int(os.environ.get('RANK', os.environ.get('SLURM_PROCID', '0'))) == 0


# ------------------------------------------------------------------ configuration from the command line
def merge_cfg_options(cfg: Config, options: Optional[dict]) -> None:
    """``--cfg-options key=value ...``."""
    if options:
        cfg.merge_from_dict(options)


def set_work_dir(cfg: Config, work_dir: Optional[str], config_path: str) -> None:
    """``--work-dir``; without it the config's ``work_dir``, else ``./work_dirs/<config name>``."""
    if work_dir is not None:
        cfg.work_dir = work_dir
    elif cfg.get('work_dir') is None:
        cfg.work_dir = osp.join('./work_dirs', osp.splitext(osp.basename(config_path))[0])


def training_device(launcher: str) -> str:
    """The kind of device the run trains on: ``'xla'``, ``'cuda'`` or ``'cpu'``."""
    return 'xla' if launcher == 'xla' else 'cuda' if torch.cuda.is_available() else 'cpu'


def amp_precision(amp: str, device: str) -> str:
    """The precision ``--amp`` means on ``device``: the value given, or without one (``'auto'``) bf16
    where the device computes it natively (GPUs of compute capability 8.0 or newer, CPUs, TPUs) and
    fp16 with dynamic loss scaling on older GPUs (:func:`vit_plugin.engine.optimizers.resolve_precision`,
    which also refuses bf16 on a GPU without it)."""
    return resolve_precision(amp, device)[0]


def use_amp(cfg: Config, amp: Optional[str], launcher: str) -> None:
    """``--amp [bf16|fp16]``: mixed precision through the optimizer wrapper of the run's device
    (bf16 without a loss scaler, fp16 with one); the choice is printed with its reason."""
    if not amp:
        return
    device = training_device(launcher)
    try:
        precision, reason = resolve_precision(amp, device)
        use_mixed_precision(cfg.optim_wrapper, precision, device)
    except ValueError as err:
        raise SystemExit(f'--amp {amp}: {err}') from None
    if is_rank_zero():
        print(reason)


def use_auto_scale_lr(cfg: Config, enable: bool) -> None:
    """``--auto-scale-lr``: scale the learning rate linearly with the real batch size."""
    if enable:
        cfg.setdefault('auto_scale_lr', {})['enable'] = True


def resume_latest(cfg: Config) -> None:
    """``--resume`` without a path: the newest intact checkpoint of the work dir (a truncated or corrupt
    one is skipped with a warning); a work dir without checkpoints starts from the beginning."""
    try:
        found = find_resumable_checkpoint(cfg.work_dir, warn=print if is_rank_zero() else None)
    except FileNotFoundError as err:
        raise SystemExit(f'ERROR: {err}') from None
    if found is None and is_rank_zero():
        print(f'--resume: no checkpoint in {cfg.work_dir}; training starts from the beginning.')
    cfg.resume = found is not None
    cfg.load_from = found


def set_resume(cfg: Config, resume: Optional[str]) -> None:
    """``--resume [CHECKPOINT]``: ``'auto'`` (no value) resumes from :func:`resume_latest`."""
    if resume == 'auto':
        resume_latest(cfg)
    elif resume is not None:
        cfg.resume = True
        cfg.load_from = resume


def skip_validation(cfg: Config) -> None:
    """``--no-validate``."""
    cfg.val_cfg = cfg.val_dataloader = cfg.val_evaluator = None


def disable_pin_memory(cfg: Config) -> None:
    """``--no-pin-memory``: no data loader pins its batches."""
    for name in ('train_dataloader', 'val_dataloader', 'test_dataloader'):
        if cfg.get(name):
            cfg[name]['pin_memory'] = False


def use_fsdp(cfg: Config) -> None:
    """``--fsdp``: train with MMEngine's FlexibleRunner and vit_plugin's FSDP2Strategy (``fully_shard``
    per Transformer block and on the root; CPU/Gloo and GPUs); ``cfg.fsdp_cfg`` (a dict) passes
    options such as ``mixed_precision='bf16'`` to the strategy. An ``EMAHook`` becomes
    ``vit_plugin.ShardedEMAHook``."""
    for hook in cfg.get('custom_hooks') or []:
        if str(hook.get('type')).split('.')[-1] == 'EMAHook':
            # mmengine's EMAHook deep-copies the model, which FSDP2 modules refuse; the sharded
            # version averages each process's shards in place (same settings, same checkpoints).
            hook['type'] = 'vit_plugin.ShardedEMAHook'
    cfg.runner_type = 'FlexibleRunner'
    cfg.strategy = dict(type='vit_plugin.FSDP2Strategy', **(cfg.get('fsdp_cfg') or {}))


def use_compile(cfg: Config, enable: bool) -> None:
    """``--compile``: mmengine's ``compile`` option (the runner ``torch.compile``s ``train_step``); a
    ``compile`` dict of the config (``torch.compile`` arguments) is kept."""
    if enable and not isinstance(cfg.get('compile'), dict):
        cfg.compile = True


def use_device_defaults(cfg: Config, launcher: str, tf32: bool = True) -> None:
    """What a GPU run gets unless the config says otherwise: the fused optimizer kernel, TF32 for fp32
    matmuls (``--no-tf32`` or ``env_cfg.tf32=False`` switches it off) and pinned loader memory
    (:mod:`vit_plugin.engine.device_defaults`). Called in every process (TF32 is a process setting)."""
    if not tf32:
        cfg.setdefault('env_cfg', {})['tf32'] = False
    for message in apply_device_defaults(cfg, training_device(launcher)):
        if is_rank_zero():
            print(message)


# ------------------------------------------------------------------------- processes and strategy
def setup_launcher(cfg: Config, launcher: str, fsdp: bool = False, xla_spmd: bool = False,
                   xla_layer_scan: bool = False) -> Optional[int]:
    """Everything that depends on how the processes were launched; returns the world size (None under
    ``--launcher xla``, whose processes learn it once started).

    Sets ``cfg.launcher``, picks the process-group backend (NCCL on GPUs, Gloo on CPU-only hosts)
    and makes MMEngine's DDP wrapper usable without GPUs (it passes a CUDA device id otherwise).
    Under ``--launcher xla`` the config is checked for the XLA path before any process starts.
    """
    cfg.launcher = launcher
    if xla_spmd and launcher != 'xla':
        raise SystemExit('--xla-spmd needs --launcher xla.')
    if xla_layer_scan and launcher != 'xla':
        raise SystemExit('--xla-layer-scan needs --launcher xla.')
    if launcher == 'none':
        return 1
    if launcher == 'xla':
        if fsdp:
            raise SystemExit('--fsdp is not available with --launcher xla (XLA replicates the model '
                             'and all-reduces gradients in the optimizer step).')
        try:  # fail here, before any process starts, if it cannot run
            to_xla_config(cfg, spmd=xla_spmd, layer_scan=xla_layer_scan)
        except ValueError as err:
            raise SystemExit(f'--launcher xla: {err}') from None
        return None  # torch_xla.launch starts one process per device; they know the world size
    if not torch.cuda.is_available():
        cfg.env_cfg.setdefault('dist_cfg', {})['backend'] = 'gloo'
        if not fsdp and cfg.get('model_wrapper_cfg') is None:
            cfg.model_wrapper_cfg = dict(type='MMDistributedDataParallel', device_ids=None,
                                         broadcast_buffers=False,
                                         find_unused_parameters=cfg.get('find_unused_parameters', False))
        if launcher in ('pytorch', 'slurm') and not torch.distributed.is_initialized():
            # MMEngine's init_dist calls torch.cuda.set_device unconditionally; on a CPU-only host we
            # join torchrun's (or srun's) process group ourselves and the runner then skips its own set-up.
            if launcher == 'slurm':
                try:
                    os.environ.update(slurm_env())
                except KeyError as err:
                    raise SystemExit(str(err).strip('"\'')) from None
            torch.distributed.init_process_group(backend='gloo')
    else:
        check_processes_per_gpu(launcher)
    return world_size_from_env(launcher)


def check_processes_per_gpu(launcher: str) -> None:
    """Stop, saying what to do, when a node starts more processes than it has GPUs: NCCL cannot run
    two ranks on one GPU."""
    per_node = os.environ.get('LOCAL_WORLD_SIZE') if launcher == 'pytorch' else \
        os.environ.get('SLURM_NTASKS_PER_NODE') if launcher == 'slurm' else None
    if per_node and per_node.isdigit() and int(per_node) > torch.cuda.device_count():
        raise SystemExit(f'--launcher {launcher}: {per_node} processes on this node but {torch.cuda.device_count()} '
                         f'visible GPU(s); NCCL needs one GPU per process. Start at most '
                         f'{torch.cuda.device_count()} per node, or hide the GPUs (CUDA_VISIBLE_DEVICES=) to '
                         f'train the processes on the CPU with Gloo.')


def set_global_batch(cfg: Config, world_size: Optional[int], auto_scale_lr: bool = False) -> None:
    """Reach ``cfg.global_batch_size`` by gradient accumulation over ``world_size`` processes (under
    XLA, ``world_size`` None, each process does it once started). ``--auto-scale-lr`` drops the
    global batch: the learning rate is scaled to the real batch instead."""
    if auto_scale_lr and cfg.get('global_batch_size'):
        print(f'--auto-scale-lr: dropping global_batch_size={cfg.global_batch_size} (no gradient '
              f'accumulation); the learning rate is scaled to the real batch instead.')
        cfg.global_batch_size = None
    if world_size is not None:
        apply_global_batch_size(cfg, world_size, logger=print if is_rank_zero() else None)


# ----------------------------------------------------------------------------------------- the run
def build_runner(cfg: Config):
    """mmengine's Runner, or the runner ``cfg.runner_type`` names (e.g. FlexibleRunner for FSDP2)."""
    if 'runner_type' in cfg:
        return RUNNERS.build(cfg)
    return Runner.from_cfg(cfg)


def run_training(cfg: Config, world_size: Optional[int], xla_spmd: bool = False, xla_layer_scan: bool = False) -> None:
    """Train ``cfg`` in this process, or under ``--launcher xla`` (``world_size`` None) in the processes
    torch_xla starts, one per device (one per host with ``xla_spmd``)."""
    if world_size is None:
        launch_training(cfg, prepare=apply_global_batch_size, spmd=xla_spmd, layer_scan=xla_layer_scan)
        return
    try:
        build_runner(cfg).train()
    except TrainingPreempted:  # every process stops at the same iteration: the group can go too
        release_process_group()
        raise
    release_process_group()


def release_process_group() -> None:
    """Destroys the default process group, if this process has one, once the run is over.

    mmengine leaves it to the interpreter's exit. Only after a run, where every process ends at the same
    point: a group destroyed while another process still waits in a collective would fail that one.
    """
    global _JOINED_GROUP
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
        _JOINED_GROUP = True


#: Whether this process took part in a multi-process run (see :func:`run_as_script`).
_JOINED_GROUP = False


def run_as_script(main: Callable[[], Any]) -> None:
    """Runs a tool's ``main`` as the whole work of the process and exits with its status.

    A process of a multi-process run leaves through ``os._exit`` once its output is flushed: with torch
    2.15 and Gloo, a rank that has finished and saved everything can still abort in the interpreter's
    C++ teardown ('terminate called without an active exception', exit -6), and torchrun then reports
    the whole job as failed. A single process, or one that ends in an error, exits as usual.
    """
    try:
        main()
        code = 0
    except SystemExit as stop:
        code = stop.code
    if not _JOINED_GROUP:
        sys.exit(code)
    if isinstance(code, str):
        print(code, file=sys.stderr)
        code = 1
    gc.collect()  # data-loader iterators of the finished run shut their worker processes down
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code or 0)


@contextmanager
def exit_on_expected_errors():
    """Turn the errors a user fixes outside the code into their message and an exit status: a missing
    data root (:data:`DATA_NOT_FOUND_EXIT_CODE`; a stack trace from inside the data loader would
    only hide which path is missing) and a diverged run (:data:`NONFINITE_EXIT_CODE`; an expected
    outcome, not a bug, whose message says what to do next)."""
    try:
        yield
    except DataRootNotFoundError as err:
        print(f'\nERROR: {err}', file=sys.stderr)
        raise SystemExit(DATA_NOT_FOUND_EXIT_CODE) from None
    except NonFiniteTrainingError as err:
        print(f'\nERROR: {err}', file=sys.stderr)
        raise SystemExit(NONFINITE_EXIT_CODE) from None
