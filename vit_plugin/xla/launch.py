"""An ordinary config turned into an XLA run, one process per device each planning its run (docs/scaling.md)."""
import copy
from dataclasses import dataclass
from typing import Callable, Optional

import torch
from mmengine.config import Config

from vit_plugin.engine.config_edits import ConfigEdits, type_name
from vit_plugin.engine.plan import RunEnv, names_vit_plugin_runner, plan_run

from . import runtime
from . import spmd as spmd_mode
from .scan import check_scannable, require_scan_support
from .strategy import xla_optim_wrapper_cfg

_TRAIN_LOOPS = {
    'EpochBasedTrainLoop': 'vit_plugin.XLAEpochBasedTrainLoop',
    'IterBasedTrainLoop': 'vit_plugin.XLAIterBasedTrainLoop',
    'vit_plugin.IterBasedTrainLoop': 'vit_plugin.XLAIterBasedTrainLoop',  # both resume by skipping
}
_EVAL_LOOPS = {'ValLoop': 'vit_plugin.XLAValLoop', 'TestLoop': 'vit_plugin.XLATestLoop'}
_VIT_PLUGIN_RUNNERS = ('vit_plugin.Runner', 'vit_plugin.FlexibleRunner')


def _strip(name):
    return name.split('.', 1)[1] if isinstance(name, str) and name.startswith('mmengine.') else name


def _xla_loop(edits: ConfigEdits, key: str, default: str, table: dict) -> None:
    loop = edits.get(key)
    kind = _strip(loop.get('type'))
    if kind is None:
        edits.set((key, 'type'), table[default])
    elif kind in table:
        edits.set((key, 'type'), table[kind])
    elif not str(kind).startswith('vit_plugin.XLA'):
        raise ValueError(f'{key}: loop type {loop["type"]!r} has no XLA version. Use one of '
                         f'{sorted(table)} (or their vit_plugin.XLA* versions).')


@dataclass(frozen=True)
class XLAConversion:
    """The run plan's conversion to XLA: FlexibleRunner, ``vit_plugin.XLAStrategy``, XLA loops and optimizer wrapper.

    Args:
        bf16 (bool): Run forward passes under bf16 autocast. Defaults to False.
        spmd (bool): One process for all devices (:mod:`~vit_plugin.xla.spmd`). Defaults to False.
        layer_scan (bool): Run the ViT's blocks as one compiled loop. Defaults to False.
    """
    bf16: bool = False
    spmd: bool = False
    layer_scan: bool = False
    name = 'xla'

    def plan(self, edits: ConfigEdits, env: RunEnv, log: Callable[[str], None]) -> None:
        """Record the conversion on ``edits``; ValueError for a runner, strategy, loop or wrapper XLA cannot run."""
        runner_type = _strip(edits.get('runner_type'))
        if runner_type not in (None, 'Runner', 'FlexibleRunner', *_VIT_PLUGIN_RUNNERS):
            raise ValueError(f'runner_type={edits.get("runner_type")!r}: the XLA path runs on mmengine\'s '
                             "FlexibleRunner; use 'vit_plugin.Runner' or remove runner_type from the config.")
        strategy = edits.get('strategy') or {}
        if strategy and _strip(strategy.get('type')) not in (None, 'vit_plugin.XLAStrategy'):
            raise ValueError(f'strategy={strategy.get("type")!r} cannot run on XLA; remove `strategy` '
                             'from the config (the XLA launcher sets vit_plugin.XLAStrategy).')
        if self.layer_scan:
            require_scan_support(self.spmd)
        edits.set('runner_type',
                  'vit_plugin.FlexibleRunner' if runner_type in _VIT_PLUGIN_RUNNERS else 'FlexibleRunner')
        options = {key: True for key, on in (('spmd', self.spmd), ('layer_scan', self.layer_scan)) if on}
        edits.update('strategy', dict(strategy, type='vit_plugin.XLAStrategy', **options))
        edits.set('launcher', env.launcher)
        edits.delete('model_wrapper_cfg')  # DDP settings; XLA all-reduces in the optimizer step
        # FlexibleRunner.from_cfg passes env_cfg=None through when the config has none, and fails.
        if not edits.get('env_cfg'):
            edits.set('env_cfg', dict())
        edits.delete('env_cfg.dist_cfg.backend')  # e.g. 'nccl' from a GPU runtime config
        if edits.get('train_cfg'):
            by_epoch = edits.get('train_cfg.by_epoch')
            edits.delete('train_cfg.by_epoch')
            default = 'IterBasedTrainLoop' if by_epoch is False else 'EpochBasedTrainLoop'
            _xla_loop(edits, 'train_cfg', default, _TRAIN_LOOPS)
            wrapper = xla_optim_wrapper_cfg(edits.get('optim_wrapper'))
            if self.bf16:
                wrapper['dtype'] = 'bfloat16'
            edits.update('optim_wrapper', wrapper)
            if not edits.get('train_dataloader.drop_last', False):
                edits.set('train_dataloader.drop_last', True)
                log('XLA: train_dataloader.drop_last set to True (fixed batch shapes).')
        for key, default in (('val_cfg', 'ValLoop'), ('test_cfg', 'TestLoop')):
            if edits.get(key) is not None:
                _xla_loop(edits, key, default, _EVAL_LOOPS)

    def check(self, cfg: Config) -> None:
        """With ``layer_scan``: refuse a backbone that cannot scan (built on the meta device)."""
        backbone = (cfg.get('model') or {}).get('backbone') or {}
        if not self.layer_scan or type_name(backbone) not in ('ViT', 'HybridViT'):
            return
        from mmengine.registry import MODELS
        with torch.device('meta'):
            check_scannable(MODELS.build(copy.deepcopy(backbone)), 'model.backbone')


def xla_env(launcher: str, world_size: Optional[int] = None, rank_zero: bool = True) -> RunEnv:
    """The run environment of an XLA process: ``world_size`` replicas (None: not known in this process)."""
    return RunEnv(world_size=world_size, device='xla', launcher=launcher, flexible=True, rank_zero=rank_zero,
                  gpus=torch.cuda.device_count())


def plan_xla_run(cfg: Config, env: RunEnv, bf16: bool = False, spmd: bool = False, layer_scan: bool = False):
    """The run plan of ``cfg`` on XLA devices (all steps for vit_plugin's runners, else the XLA essentials)."""
    steps = None if names_vit_plugin_runner(cfg) else ('global_batch', 'nonfinite_guard', 'conversion')
    return plan_run(cfg, env, conversion=XLAConversion(bf16=bf16, spmd=spmd, layer_scan=layer_scan), steps=steps)


def to_xla_config(cfg: Config, launcher: str = 'xla', bf16: bool = False, spmd: bool = False,
                  layer_scan: bool = False) -> Config:
    """A copy of ``cfg`` with the :class:`XLAConversion` step applied; ValueError for what cannot run on XLA.

    ``launcher`` is ``'xla'``, ``'pytorch'`` (torchrun) or ``'none'``; the rest as :class:`XLAConversion`.
    """
    conversion = XLAConversion(bf16=bf16, spmd=spmd, layer_scan=layer_scan)
    return plan_run(cfg, xla_env(launcher), conversion=conversion, steps=('nonfinite_guard', 'conversion')).apply(cfg)


def _train_worker(index: int, cfg: Config, launcher: str, bf16: bool,
                  prepare: Optional[Callable], spmd: bool = False, layer_scan: bool = False) -> None:
    """Body of each process of ``torch_xla.launch``: plan, apply, build the runner, train."""
    from mmengine.registry import RUNNERS
    from mmengine.utils import import_modules_from_strings

    if cfg.get('custom_imports'):  # Config.fromfile imported them in the parent process only
        import_modules_from_strings(**cfg.custom_imports)
    master = runtime.is_master()
    if prepare is not None:
        prepare(cfg, runtime.world_size(), logger=print if master else None)
    plan = plan_xla_run(cfg, xla_env(launcher, runtime.world_size(), master), bf16=bf16, spmd=spmd,
                        layer_scan=layer_scan)
    if master:
        for note in plan.notes:
            print(note)
    runner = RUNNERS.build(plan.apply(cfg))
    runner.train()


def launch_training(cfg: Config, bf16: bool = False, prepare: Optional[Callable] = None,
                    spmd: bool = False, layer_scan: bool = False) -> None:
    """Train ``cfg`` on every local XLA device, one process each (directly under torchrun or ``PJRT_DEVICE=CPU``).

    Call it before this process touches the XLA device or runs a CPU backward pass. ``prepare(cfg,
    world_size, logger=...)``, importable by name, runs in each process before planning; the other
    arguments are :class:`XLAConversion`'s.
    """
    import torch.distributed as dist

    xla = runtime.require('torch_xla')
    if spmd:
        if dist.is_torchelastic_launched():
            raise RuntimeError('--xla-spmd runs one process per host; start it with python, not torchrun '
                               '(multi-host pods: one such process per host VM).')
        spmd_mode.enable()
        _train_worker(0, cfg, 'none', bf16, prepare, spmd=True, layer_scan=layer_scan)
        return
    launcher = 'pytorch' if dist.is_torchelastic_launched() else 'xla'
    # torch_xla runs a single replica on its CPU backend; train it in this process instead of a
    # spawned copy (saves re-importing the whole stack, and keeps the run easy to debug).
    single = runtime.require('torch_xla.runtime').device_type() == 'CPU'
    xla.launch(_train_worker, args=(cfg, launcher, bf16, prepare, False, layer_scan),
               debug_single_process=single)
