"""One plan per run, computed once, printable before anything is built.

See docs/configs.md#one-runner-named-by-the-config.
"""
import copy
import os
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence, Tuple

import torch
from mmengine.config import ConfigDict
from mmengine.dist import infer_launcher

from .checkpointing import find_resumable_checkpoint
from .config_edits import MISSING, Change, ConfigEdits, plain, type_name
from .device_defaults import plan_device_defaults
from .global_batch import RECORD_KEY, plan_global_batch, recorded_plan, world_size_from_env
from .hooks import use_input_norm_check
from .optimizers import guarded_optim_wrapper_cfg
from .preemption import use_preemption_safe_hooks
from .vis_backends import backend_types, check_vis_backends


class RunSetupError(ValueError):
    """The config or the launch cannot run as given; the message says what to change."""


#: The config keys that switch the steps of the plan, with their defaults.
SWITCHES = dict(device_defaults=True, preemption=True, input_norm_check=True)
#: Launchers whose processes form a process group.
DISTRIBUTED_LAUNCHERS = ('pytorch', 'slurm', 'mpi')
#: The runner types that apply the plan when they are built.
VIT_PLUGIN_RUNNERS = ('vit_plugin.Runner', 'vit_plugin.FlexibleRunner')
#: The steps of a plan, in order.
STEPS = ('vis_backends', 'global_batch', 'nonfinite_guard', 'conversion', 'device_defaults', 'process_group',
         'preemption', 'resume', 'input_norm_check', 'sharded_ema')
_FROM_ENV = object()


def is_rank_zero() -> bool:
    """Whether this process is rank 0 of its process group, or before one exists, of its launch."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank() == 0
    return int(os.environ.get('RANK', os.environ.get('SLURM_PROCID', '0'))) == 0


def device_kind(cfg=None, launcher: Optional[str] = None) -> str:
    """The device a run trains on: ``'xla'`` (XLA launcher or strategy), else ``'cuda'`` or ``'cpu'``."""
    cfg = cfg or {}
    if (launcher or cfg.get('launcher')) == 'xla' or type_name(cfg.get('strategy')) == 'XLAStrategy':
        return 'xla'
    return 'cuda' if torch.cuda.is_available() else 'cpu'


def run_launcher(cfg, flexible: bool = False) -> str:
    """The config's ``launcher``; without one ``'none'``, or for FlexibleRunner the launcher the environment shows."""
    launcher = (cfg or {}).get('launcher')
    if launcher is None:
        launcher = infer_launcher() if flexible else 'none'
    return launcher


def names_vit_plugin_runner(cfg) -> bool:
    """Whether the config's ``runner_type`` is one of vit_plugin's runners (which apply the plan)."""
    return str(cfg.get('runner_type', '')) in VIT_PLUGIN_RUNNERS


@dataclass(frozen=True)
class RunEnv:
    """What the plan needs to know about the processes that will train.

    Attributes:
        world_size (int, optional): Data-parallel processes; None where unknown here (XLA replicas).
        device (str): ``'cpu'``, ``'cuda'`` or ``'xla'``.
        launcher (str): ``'none'``, ``'pytorch'``, ``'slurm'``, ``'mpi'`` or ``'xla'``.
        flexible (bool): Built as a FlexibleRunner (a ``strategy`` wraps the model).
        rank_zero (bool): Whether this process is rank 0.
        gpus (int): GPUs visible to this process.
        processes_per_node (int, optional): Processes the launcher starts on this node, where it says.
        group_joined (bool): Whether this process has joined its process group.
    """
    world_size: Optional[int] = 1
    device: str = 'cpu'
    launcher: str = 'none'
    flexible: bool = False
    rank_zero: bool = True
    gpus: int = 0
    processes_per_node: Optional[int] = None
    group_joined: bool = False

    @classmethod
    def from_process(cls, cfg=None, flexible: bool = False, device: Optional[str] = None,
                     launcher: Optional[str] = None, world_size=_FROM_ENV) -> 'RunEnv':
        """This process's environment for ``cfg``; world size from the joined group, else the launcher's."""
        launcher = launcher or run_launcher(cfg, flexible)
        device = device or device_kind(cfg, launcher)
        joined = torch.distributed.is_available() and torch.distributed.is_initialized()
        if world_size is _FROM_ENV:
            if device == 'xla' and launcher in ('xla', 'none'):
                world_size = None
            else:
                world_size = torch.distributed.get_world_size() if joined else world_size_from_env(launcher)
        per_node = os.environ.get({'pytorch': 'LOCAL_WORLD_SIZE', 'slurm': 'SLURM_NTASKS_PER_NODE'}.get(launcher, ''))
        return cls(world_size=world_size, device=device, launcher=launcher, flexible=flexible,
                   rank_zero=is_rank_zero(), gpus=torch.cuda.device_count(),
                   processes_per_node=int(per_node) if per_node and per_node.isdigit() else None,
                   group_joined=joined)


@dataclass(frozen=True)
class RunPlan:
    """What a run changes in its config and in its process, computed by :func:`plan_run`.

    Attributes:
        env (RunEnv): The environment it was planned for.
        steps (tuple[str]): The steps that ran (:data:`STEPS`, less those switched off).
        accumulative_counts (int): Micro-batches per optimizer step.
        changes (tuple[Change]): Each key of the config changed, with its value before and after.
        notes (tuple[str]): One sentence per decision, for the log.
        tf32 (bool, optional): The TF32 setting the run starts with (CUDA; None: left alone).
        join_process_group (bool): The run joins its process group itself, over Gloo.
        resume_from (str, optional): The intact checkpoint the run resumes from.
        conversion (object, optional): The device conversion planned (checked on :meth:`apply`).
    """
    env: RunEnv
    steps: Tuple[str, ...] = ()
    accumulative_counts: int = 1
    changes: Tuple[Change, ...] = ()
    notes: Tuple[str, ...] = ()
    tf32: Optional[bool] = None
    join_process_group: bool = False
    resume_from: Optional[str] = None
    conversion: Optional[object] = field(default=None, compare=False)

    @property
    def hooks_added(self) -> Tuple[str, ...]:
        """The hooks the plan adds or whose type it changes, as ``'key: type'``."""
        found = []
        for change in self.changes:
            if change.key[0] not in ('default_hooks', 'custom_hooks'):
                continue
            before, after = change.before, change.after
            if isinstance(after, dict) and after.get('type') and (
                    not isinstance(before, dict) or before.get('type') != after['type']):
                found.append(f'{change.path}: {after["type"]}')
            elif change.key[-1] == 'type':
                found.append(f'{".".join(str(part) for part in change.key[:-1])}: {after}')
        return tuple(found)

    def apply(self, cfg, in_place: bool = False):
        """The config with the plan's changes (a copy, unless ``in_place``); runs the conversion's check."""
        out = cfg if in_place else copy.deepcopy(cfg)
        ConfigEdits.apply(out, self.changes)
        if self.conversion is not None:
            self.conversion.check(out)
        return out

    def describe(self) -> str:
        """The plan as text: the environment, the decisions, then each change (``key: before -> after``)."""
        env = self.env
        processes = 'not known here' if env.world_size is None else str(env.world_size)
        lines = [f'Run plan: {processes} process(es), launcher {env.launcher!r}, device {env.device}, '
                 f'{"FlexibleRunner" if env.flexible else "Runner"}',
                 f'  steps: {", ".join(self.steps) or "none"}',
                 f'  accumulation: {self.accumulative_counts} micro-batch(es) per optimizer step']
        if self.tf32 is not None:
            lines.append(f'  TF32: {"on" if self.tf32 else "off"} when the run starts')
        if self.join_process_group:
            lines.append(f'  process group: joined over Gloo when the run starts (launcher {env.launcher!r})')
        if self.hooks_added:
            lines.append(f'  hooks: {"; ".join(self.hooks_added)}')
        if self.resume_from:
            lines.append(f'  resume from: {self.resume_from}')
        lines += [f'  {note}' for note in self.notes]
        if not self.changes:
            return '\n'.join(lines + ['Changes to the config: none'])
        lines.append('Changes to the config (key: before -> after):')
        lines += [f'  [{change.step}] {change}' for change in self.changes]
        return '\n'.join(lines)


def plan_run(cfg, env: RunEnv, conversion=None, steps: Optional[Sequence[str]] = None) -> RunPlan:
    """The plan of a run of ``cfg`` in ``env``; ``cfg`` is not modified, nothing is built or loaded.

    Args:
        cfg (Config): The full config, as ``Runner.from_cfg`` takes it.
        env (RunEnv): The environment (:meth:`RunEnv.from_process` reads this process's).
        conversion (object, optional): A device conversion with ``name``, ``plan(edits, env, log)`` and
            ``check(cfg)`` (``vit_plugin.xla.launch.XLAConversion``). Defaults to None.
        steps (sequence of str, optional): The steps to plan, of :data:`STEPS`. Defaults to all.

    Raises:
        RunSetupError: What the config or the launch must change.
    """
    steps = STEPS if steps is None else tuple(steps)
    switches = {key: cfg.get(key, default) for key, default in SWITCHES.items()}
    wanted = [step for step in steps if _switched_on(step, switches) and (step != 'conversion' or conversion)]
    edits, notes = ConfigEdits(cfg), []
    tf32, join, resume_from = None, False, None
    try:
        for step in wanted:
            edits.step = conversion.name if step == 'conversion' else step.replace('_', ' ')
            if step == 'vis_backends':
                _plan_vis_backends(edits, notes.append)
            elif step == 'global_batch':
                plan_global_batch(edits, env.world_size, notes.append)
            elif step == 'nonfinite_guard':
                _plan_nonfinite_guard(edits)
            elif step == 'conversion':
                conversion.plan(edits, env, notes.append)
            elif step == 'device_defaults':
                tf32 = plan_device_defaults(edits, env.device, env.gpus > 0, notes.append)
            elif step == 'process_group':
                join = _plan_process_group(edits, env)
            elif step == 'preemption':
                _plan_hooks(edits, use_preemption_safe_hooks)
            elif step == 'resume':
                resume_from = _plan_resume(edits, notes.append)
            elif step == 'input_norm_check':
                _plan_hooks(edits, use_input_norm_check)
            elif step == 'sharded_ema':
                _plan_sharded_ema(edits)
    except RunSetupError:
        raise
    except ValueError as err:
        raise RunSetupError(str(err)) from None
    wrapper = edits.get('optim_wrapper')
    counts = wrapper.get('accumulative_counts', 1) if isinstance(wrapper, dict) else 1
    return RunPlan(env=env, steps=tuple(wanted), accumulative_counts=counts, changes=edits.changes(),
                   notes=tuple(notes), tf32=tf32, join_process_group=join, resume_from=resume_from,
                   conversion=conversion if 'conversion' in wanted else None)


def _switched_on(step: str, switches: dict) -> bool:
    switch = {'device_defaults': 'device_defaults', 'process_group': 'device_defaults', 'preemption': 'preemption',
              'resume': 'preemption', 'input_norm_check': 'input_norm_check'}.get(step)
    return switch is None or bool(switches[switch])


# ----------------------------------------------------------------------------------------- the steps
def check_processes_per_gpu(launcher: str) -> None:
    """Raise :class:`RunSetupError` for a node with more processes than GPUs (NCCL needs one GPU each)."""
    _check_processes_per_gpu(RunEnv.from_process(launcher=launcher, device='cuda', world_size=1))


def _check_processes_per_gpu(env: RunEnv) -> None:
    per_node, gpus = env.processes_per_node, env.gpus
    if per_node and per_node > gpus:
        raise RunSetupError(f'launcher={env.launcher!r}: {per_node} processes on this node but {gpus} visible '
                            f'GPU(s); NCCL needs one GPU per process. Start at most {gpus} per node, or hide '
                            f'the GPUs (CUDA_VISIBLE_DEVICES=) to train on the CPU with Gloo.')


def _plan_process_group(edits: ConfigEdits, env: RunEnv) -> bool:
    """Gloo for a multi-process run without GPUs; returns whether the run joins the group itself."""
    if env.launcher not in DISTRIBUTED_LAUNCHERS:
        return False
    if env.device == 'cuda':
        _check_processes_per_gpu(env)
    if env.device != 'cpu':
        return False
    edits.set('env_cfg.dist_cfg.backend', 'gloo')
    if not env.flexible and edits.get('model_wrapper_cfg') is None:
        edits.set('model_wrapper_cfg', dict(type='MMDistributedDataParallel', device_ids=None, broadcast_buffers=False,
                                            find_unused_parameters=edits.get('find_unused_parameters', False)))
    return env.launcher in ('pytorch', 'slurm') and not env.group_joined


def _plan_hooks(edits: ConfigEdits, add: Callable) -> None:
    before = edits.get('default_hooks') or {}
    holder = ConfigDict(default_hooks=copy.deepcopy(before))
    add(holder)
    for name, hook in plain(holder.default_hooks).items():
        if before.get(name, MISSING) != hook:
            edits.set(('default_hooks', name), hook)


def _plan_resume(edits: ConfigEdits, log: Callable[[str], None]) -> Optional[str]:
    """The newest intact checkpoint for ``resume=True`` without ``load_from``; RunSetupError if none is intact."""
    if not edits.get('resume') or edits.get('load_from') is not None or not edits.get('work_dir'):
        return None
    try:
        found = find_resumable_checkpoint(edits.get('work_dir'), warn=log)
    except FileNotFoundError as err:
        raise RunSetupError(str(err)) from None
    if found is None:
        log(f'resume: no checkpoint in {edits.get("work_dir")}; training starts from the beginning.')
    edits.set('resume', found is not None)
    edits.set('load_from', found)
    return found


def _plan_vis_backends(edits: ConfigEdits, log: Callable[[str], None]) -> None:
    visualizer = plain(edits.get('visualizer'))
    check_vis_backends(visualizer)
    dashboards = [kind for kind in backend_types(visualizer) if kind != 'LocalVisBackend']
    if dashboards:
        log(f'vis backends: {", ".join(dashboards)} (written by rank 0; docs/monitoring.md)')


def _plan_nonfinite_guard(edits: ConfigEdits) -> None:
    before = edits.get('optim_wrapper')
    if not isinstance(before, dict):
        return
    after = guarded_optim_wrapper_cfg(plain(before), plain((edits.get('default_hooks') or {}).get('nonfinite_guard')))

    def set_differing(key: tuple, old: dict, new: dict) -> None:
        for name, value in new.items():
            if isinstance(value, dict) and isinstance(old.get(name), dict) and name != 'optimizer':
                set_differing(key + (name, ), old[name], value)
            elif old.get(name, MISSING) != value:
                edits.set(key + (name, ), value)
        for name in set(old) - set(new):
            edits.delete(key + (name, ))

    set_differing(('optim_wrapper', ), plain(before), after)


def _plan_sharded_ema(edits: ConfigEdits) -> None:
    if type_name(edits.get('strategy')) != 'FSDP2Strategy':
        return
    for i, hook in enumerate(edits.get('custom_hooks') or []):
        if type_name(hook) == 'EMAHook':
            edits.set(('custom_hooks', i, 'type'), 'vit_plugin.ShardedEMAHook')


__all__ = ['DISTRIBUTED_LAUNCHERS', 'RECORD_KEY', 'RunEnv', 'RunPlan', 'RunSetupError', 'STEPS', 'SWITCHES',
           'VIT_PLUGIN_RUNNERS', 'check_processes_per_gpu', 'device_kind', 'is_rank_zero', 'names_vit_plugin_runner',
           'plan_run', 'recorded_plan', 'run_launcher']
