"""What ``tools/train.py`` and ``tools/test.py`` do between reading the config and running the runner.

One function per option, each editing the config in place, then the run itself. Options and the
keys they set: docs/configs.md.
"""
import dataclasses
import gc
import logging
import os
import os.path as osp
import sys
from contextlib import contextmanager
from typing import Any, Callable, Optional, Sequence

import torch
from mmengine.config import Config
from mmengine.registry import RUNNERS
from mmengine.runner import Runner

from vit_plugin import runtime
from vit_plugin.datasets.checked import DataRootNotFoundError
from vit_plugin.engine.config_edits import type_name
from vit_plugin.engine.data_faults import TrainingDataFault
from vit_plugin.engine.data_identity import DataChangedError
from vit_plugin.engine.hooks import NonFiniteTrainingError
from vit_plugin.engine.optimizers import resolve_precision, use_mixed_precision
from vit_plugin.engine.plan import RunEnv, device_kind, names_vit_plugin_runner, plan_run
from vit_plugin.engine.preemption import TrainingPreempted
from vit_plugin.engine.vis_backends import add_vis_backends
from vit_plugin.engine.runner import (RunSetupError, check_processes_per_gpu, is_rank_zero,  # noqa: F401
                                     use_device_defaults)
from vit_plugin.xla import launch_training, to_xla_config
from vit_plugin.xla.launch import plan_xla_run, xla_env

#: Launchers of ``tools/train.py``; ``tools/test.py`` takes all but ``xla``.
LAUNCHERS = ('none', 'pytorch', 'slurm', 'mpi', 'xla')
#: Exit status when the data root is missing (the message names the path).
DATA_NOT_FOUND_EXIT_CODE = 2
#: Exit status of a run stopped by vit_plugin.NonFiniteGuardHook (too many NaN/inf steps in a row).
NONFINITE_EXIT_CODE = 3


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
    return device_kind(launcher=launcher)


def amp_precision(amp: str, device: str) -> str:
    """The precision ``--amp`` means on ``device``: the value given, or for ``'auto'`` bf16 where native, else fp16."""
    return resolve_precision(amp, device)[0]


def use_amp(cfg: Config, amp: Optional[str], launcher: str) -> None:
    """``--amp [bf16|fp16]``: mixed precision through the optimizer wrapper of the run's device."""
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
    """``--auto-scale-lr``: ``auto_scale_lr.enable=True``; the runner then drops ``global_batch_size``."""
    if enable:
        auto_scale_lr = cfg.get('auto_scale_lr') or {}
        auto_scale_lr['enable'] = True
        cfg.auto_scale_lr = auto_scale_lr


def set_resume(cfg: Config, resume: Optional[str]) -> None:
    """``--resume [CHECKPOINT]``: ``resume=True`` and ``load_from`` (None for ``'auto'``: the newest intact one)."""
    if resume is not None:
        cfg.resume = True
        cfg.load_from = None if resume == 'auto' else resume


def skip_validation(cfg: Config) -> None:
    """``--no-validate``."""
    cfg.val_cfg = cfg.val_dataloader = cfg.val_evaluator = None


def disable_pin_memory(cfg: Config) -> None:
    """``--no-pin-memory``: no data loader pins its batches."""
    for name in ('train_dataloader', 'val_dataloader', 'test_dataloader'):
        if cfg.get(name):
            cfg[name]['pin_memory'] = False


def disable_tf32(cfg: Config) -> None:
    """``--no-tf32``: ``env_cfg.tf32=False``, fp32 matmuls and convolutions in full fp32 on GPUs."""
    env_cfg = cfg.get('env_cfg') or {}
    env_cfg['tf32'] = False
    cfg.env_cfg = env_cfg


def use_fsdp(cfg: Config) -> None:
    """``--fsdp``: ``vit_plugin.FlexibleRunner`` with ``vit_plugin.FSDP2Strategy``; ``cfg.fsdp_cfg`` passes options."""
    cfg.runner_type = 'vit_plugin.FlexibleRunner'
    cfg.strategy = dict(type='vit_plugin.FSDP2Strategy', **(cfg.get('fsdp_cfg') or {}))


def use_compile(cfg: Config, enable: bool) -> None:
    """``--compile``: mmengine's ``compile`` option; a ``compile`` dict of the config is kept."""
    if enable and not isinstance(cfg.get('compile'), dict):
        cfg.compile = True


def use_vis_backends(cfg: Config, names: Optional[Sequence[str]]) -> None:
    """``--vis tensorboard|wandb|mlflow ...``: mmengine's backends added to ``visualizer.vis_backends``."""
    if names:
        cfg.visualizer = add_vis_backends(cfg.get('visualizer'), names)


# ---------------------------------------------------------------------------------------- the launcher
def setup_launcher(cfg: Config, launcher: str, xla_spmd: bool = False, xla_layer_scan: bool = False) -> None:
    """``--launcher``, ``--xla-spmd``, ``--xla-layer-scan``: ``cfg.launcher`` and ``strategy`` keys.

    Raises:
        SystemExit: An XLA option without ``--launcher xla``, ``--fsdp`` or a config the XLA path cannot
            run under it, or more processes than GPUs on a GPU host; the message says which.
    """
    cfg.launcher = launcher
    if xla_spmd and launcher != 'xla':
        raise SystemExit('--xla-spmd needs --launcher xla.')
    if xla_layer_scan and launcher != 'xla':
        raise SystemExit('--xla-layer-scan needs --launcher xla.')
    if launcher in ('pytorch', 'slurm') and torch.cuda.is_available():
        try:
            check_processes_per_gpu(launcher)
        except RunSetupError as err:
            raise SystemExit(f'ERROR: {err}') from None
    if launcher != 'xla':
        return
    if type_name(cfg.get('strategy')) == 'FSDP2Strategy':
        raise SystemExit('--fsdp is not available with --launcher xla (XLA replicates the model '
                         'and all-reduces gradients in the optimizer step).')
    if xla_spmd or xla_layer_scan:
        strategy = cfg.get('strategy') or {}
        strategy.update({key: True for key, on in (('spmd', xla_spmd), ('layer_scan', xla_layer_scan)) if on})
        cfg.strategy = strategy
    try:  # fail here, before any process starts, if it cannot run
        to_xla_config(cfg, **xla_options(cfg))
    except ValueError as err:
        raise SystemExit(f'--launcher xla: {err}') from None


def xla_options(cfg: Config) -> dict:
    """``spmd`` and ``layer_scan`` of the config's ``strategy`` (``--xla-spmd``, ``--xla-layer-scan``)."""
    strategy = cfg.get('strategy') or {}
    return dict(spmd=bool(strategy.get('spmd')), layer_scan=bool(strategy.get('layer_scan')))


# ----------------------------------------------------------------------------------------- the run
def build_runner(cfg: Config):
    """The runner ``cfg.runner_type`` names, else mmengine's ``Runner``."""
    if 'runner_type' in cfg:
        return RUNNERS.build(cfg)
    return Runner.from_cfg(cfg)


def run_training(cfg: Config) -> None:
    """Train ``cfg`` in this process, or under ``launcher='xla'`` in one process per device."""
    if cfg.get('launcher') == 'xla':
        launch_training(cfg, **xla_options(cfg))
        return
    try:
        build_runner(cfg).train()
    except (TrainingPreempted, TrainingDataFault):  # every process stops at the same iteration: the group can go
        release_process_group()
        raise
    release_process_group()


def plan_training(cfg: Config, world_size: Optional[int] = None):
    """The run plan ``tools/train.py`` applies to ``cfg`` here (nothing is built); None if the runner has none.

    Args:
        cfg (Config): The config with the options merged.
        world_size (int, optional): Processes to plan for. Defaults to None: the launcher's environment.
    """
    if cfg.get('launcher') == 'xla':
        return plan_xla_run(cfg, xla_env('xla', world_size or 1), **xla_options(cfg))
    if not names_vit_plugin_runner(cfg):
        return None
    flexible = cfg.get('runner_type') == 'vit_plugin.FlexibleRunner'
    env = RunEnv.from_process(cfg, flexible=flexible)
    if world_size is not None:
        env = dataclasses.replace(env, world_size=world_size)
    return plan_run(cfg, env)


def dry_run(cfg: Config, world_size: Optional[int] = None) -> str:
    """``--dry-run``: the text of the run plan of ``cfg`` and its config changes; builds nothing."""
    plan = plan_training(cfg, world_size)
    if plan is None:
        return (f'runner_type={cfg.get("runner_type")!r}: mmengine\'s runner trains the config as it is '
                f'(vit_plugin\'s run plan applies to runner_type=\'vit_plugin.Runner\').')
    return plan.describe()


def release_process_group() -> None:
    """Destroy the default process group, if any, once a run is over (every rank at the same point)."""
    global _JOINED_GROUP
    if runtime.release_process_group():
        _JOINED_GROUP = True


#: Whether this process took part in a multi-process run (see :func:`run_as_script`).
_JOINED_GROUP = False


def run_as_script(main: Callable[[], Any]) -> None:
    """Run a tool's ``main`` as the whole work of the process and exit with its status.

    A rank of a multi-process run leaves through ``os._exit`` once flushed (Gloo teardown can abort).
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
    """Turn errors a user fixes outside the code into their message and an exit status.

    A missing data root (:data:`DATA_NOT_FOUND_EXIT_CODE`), a diverged run (:data:`NONFINITE_EXIT_CODE`),
    a config or launch the runner cannot run (``RunSetupError``, 1), a resume onto changed data
    (``DataChangedError``, 1).
    """
    try:
        yield
    except (RunSetupError, DataChangedError) as err:
        raise SystemExit(f'ERROR: {err}') from None
    except DataRootNotFoundError as err:
        print(f'\nERROR: {err}', file=sys.stderr)
        raise SystemExit(DATA_NOT_FOUND_EXIT_CODE) from None
    except NonFiniteTrainingError as err:
        print(f'\nERROR: {err}', file=sys.stderr)
        raise SystemExit(NONFINITE_EXIT_CODE) from None
