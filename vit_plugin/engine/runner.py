"""vit_plugin's runners: mmengine's, built from the config with the run plan applied.

See docs/configs.md#one-runner-named-by-the-config and docs/development.md#what-importing-does (the heap).
"""
import copy
import logging
from typing import Optional

import torch
from mmengine.config import Config
from mmengine.hooks import Hook
from mmengine.logging import print_log
from mmengine.model import is_model_wrapper
from mmengine.optim import OptimWrapper, OptimWrapperDict
from mmengine.runner import FlexibleRunner as MMEngineFlexibleRunner
from mmengine.runner import Runner as MMEngineRunner

from vit_plugin import runtime
from vit_plugin.registry import HOOKS, RUNNERS

from .config_edits import type_name
from .device_defaults import set_tf32
from .global_batch import recorded_plan, world_size_from_env
from .optimizers.custom_keys import check_custom_keys
from .plan import (DISTRIBUTED_LAUNCHERS, SWITCHES, RunEnv, RunPlan, RunSetupError, check_processes_per_gpu,
                   device_kind, is_rank_zero, plan_run, run_launcher)
from .preemption import release_signals
from .slurm import slurm_env


def run_device(cfg: Config) -> str:
    """The kind of device the run trains on (:func:`~vit_plugin.engine.plan.device_kind`)."""
    return device_kind(cfg)


def run_world_size(launcher: str) -> int:
    """Number of processes of the run: the joined process group's size, else the launcher's environment."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_world_size()
    return world_size_from_env(launcher)


def start_process(plan: RunPlan) -> None:
    """Make the plan's process settings: TF32 on CUDA, and the Gloo process group where the plan joins it."""
    if plan.tf32 is not None:
        message = set_tf32(plan.tf32)
        if plan.env.rank_zero:
            print(message)
    if plan.join_process_group and not torch.distributed.is_initialized():
        environ = None
        if plan.env.launcher == 'slurm':
            try:
                environ = slurm_env()
            except KeyError as err:
                raise RunSetupError(str(err).strip('"\'')) from None
        runtime.join_gloo_group(environ)


def planned(cfg: Config, env: RunEnv, steps=None) -> Config:
    """``cfg`` with the plan for ``env`` applied in place, its notes printed on rank 0, its process settings made."""
    plan = plan_run(cfg, env, steps=steps)
    if env.rank_zero:
        for note in plan.notes:
            print(note)
    plan.apply(cfg, in_place=True)
    start_process(plan)
    return cfg


def prepare_run(cfg: Config, flexible: bool = False, device: Optional[str] = None) -> Config:
    """Apply to ``cfg`` (in place, and return it) the plan of vit_plugin's runners for this process.

    ``device`` defaults to :func:`run_device`. Raises :class:`RunSetupError` naming what to change.
    """
    return planned(cfg, RunEnv.from_process(cfg, flexible=flexible, device=device))


def use_device_defaults(cfg: Config, launcher: str = 'none', device: Optional[str] = None) -> None:
    """Apply the device-defaults step of the plan alone to ``cfg`` (in place), whatever its runner."""
    planned(cfg, RunEnv.from_process(cfg, device=device, launcher=launcher), steps=('device_defaults',))


# ---------------------------------------------------------------------------------------- the runners
class RunConfig(Config):
    """The runner's copy of its config: ``pretty_text`` formats once per content.

    mmengine formats the runner's config with yapf for the log, the work dir's copy, the run's metadata and
    every checkpoint (0.1-0.6 s each); the text is the same while the content is.
    """

    @classmethod
    def of(cls, cfg: Config) -> 'RunConfig':
        """A deep copy of ``cfg`` as a :class:`RunConfig`."""
        run_cfg = copy.deepcopy(cfg)
        object.__setattr__(run_cfg, '__class__', cls)  # Config's own __setattr__ sets config keys
        return run_cfg

    @property
    def pretty_text(self) -> str:
        key = repr(self.to_dict())  # what mmengine formats
        cached = self.__dict__.get('_formatted')
        if cached is None or cached[0] != key:
            cached = (key, super().pretty_text)
            object.__setattr__(self, '_formatted', cached)
        return cached[1]


@HOOKS.register_module()
class RunnerCheckHook(Hook):
    """Stop (global batch dropped) or warn when another runner built a config naming a vit_plugin runner."""
    priority = 'VERY_HIGH'

    def before_run(self, runner) -> None:
        cfg = getattr(runner, 'cfg', None) or {}
        wanted = str(cfg.get('runner_type', ''))
        if not wanted.startswith('vit_plugin.') or isinstance(runner, (Runner, FlexibleRunner)):
            return
        built = type(runner).__name__
        if cfg.get('global_batch_size') and not recorded_plan(cfg):
            raise RunSetupError(f'The config names runner_type={wanted!r} and global_batch_size='
                                f'{cfg.global_batch_size}, but {built}.from_cfg built the run without them. Build '
                                f'it with mmengine.registry.RUNNERS.build(cfg).')
        print_log(f'The config names runner_type={wanted!r}, but {built}.from_cfg built the run: its device '
                  f'defaults and pre-emption safety are off. RUNNERS.build(cfg) builds it as configured.',
                  logger='current', level=logging.WARNING)


class _PlannedRunner:
    """Mixin of vit_plugin's runners: the ``custom_keys`` check, the heap frozen while a loop runs, and signals
    released at the end."""
    _custom_keys_checked = False

    def load_or_resume(self) -> None:
        # The first point of a training run at which both the model and the optimizer are built (mmengine's
        # FlexibleRunner builds both in its strategy's prepare()).
        if not self._custom_keys_checked and isinstance(self.optim_wrapper, (OptimWrapper, OptimWrapperDict)):
            self._custom_keys_checked = True
            model = self.model.module if is_model_wrapper(self.model) else self.model
            check_custom_keys(model, (getattr(self, 'cfg', None) or {}).get('optim_wrapper'))
        super().load_or_resume()

    # mmengine builds the data loaders inside train(), val() and test(), and collects the whole heap for each
    # dataset it serializes (about 0.7 s for the imports of torch and OpenMMLab); frozen, they are skipped
    # and the data-loader workers forked meanwhile share their pages.
    def train(self):
        try:
            with runtime.frozen_heap():
                return super().train()
        finally:
            release_signals(self)  # also when the run ends in an exception, which has no after_run

    def val(self):
        with runtime.frozen_heap():
            return super().val()

    def test(self):
        with runtime.frozen_heap():
            return super().test()


@RUNNERS.register_module()
class Runner(_PlannedRunner, MMEngineRunner):
    """mmengine's ``Runner`` built with the run plan applied (``'vit_plugin.Runner'``); refuses a ``strategy``."""

    @classmethod
    def from_cfg(cls, cfg: Config) -> 'Runner':
        if cfg.get('strategy'):
            raise RunSetupError(f'strategy={type_name(cfg.strategy)!r} needs a FlexibleRunner: set '
                                "runner_type='vit_plugin.FlexibleRunner' (a Runner has no strategy).")
        return super().from_cfg(planned(RunConfig.of(cfg), RunEnv.from_process(cfg)))


@RUNNERS.register_module()
class FlexibleRunner(_PlannedRunner, MMEngineFlexibleRunner):
    """mmengine's ``FlexibleRunner`` (a ``strategy`` wraps the model), built with the run plan applied."""

    @classmethod
    def from_cfg(cls, cfg: Config) -> 'FlexibleRunner':
        return super().from_cfg(planned(RunConfig.of(cfg), RunEnv.from_process(cfg, flexible=True)))


__all__ = ['DISTRIBUTED_LAUNCHERS', 'FlexibleRunner', 'RunConfig', 'Runner', 'RunnerCheckHook', 'RunSetupError',
           'SWITCHES', 'check_processes_per_gpu', 'is_rank_zero', 'prepare_run', 'run_device', 'run_launcher',
           'run_world_size', 'start_process', 'use_device_defaults']
