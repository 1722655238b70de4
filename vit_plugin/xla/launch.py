"""Turning an ordinary mmpretrain / vit_plugin config into an XLA run, and launching it.

``tools/train.py CONFIG --launcher xla`` calls :func:`launch_training`, which rewrites the config
with :func:`to_xla_config` and starts one training process per XLA device with
``torch_xla.launch`` (one process on a CPU host or a single-chip device; e.g. four on a v4-8 TPU VM,
one per chip). The config itself needs no XLA-specific edits.
"""
import copy
import logging
from typing import Callable, Optional

import torch

from mmengine.config import Config, ConfigDict
from mmengine.logging import print_log

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


def _xla_loop(loop: dict, default: str, table: dict, key: str) -> dict:
    loop = ConfigDict(copy.deepcopy(dict(loop)))
    kind = _strip(loop.get('type'))
    if kind is None:
        loop['type'] = table[default]
    elif kind in table:
        loop['type'] = table[kind]
    elif not str(kind).startswith('vit_plugin.XLA'):
        raise ValueError(f'{key}: loop type {loop["type"]!r} has no XLA version. Use one of '
                         f'{sorted(table)} (or their vit_plugin.XLA* versions).')
    return loop


def to_xla_config(cfg: Config, launcher: str = 'xla', bf16: bool = False, spmd: bool = False,
                  layer_scan: bool = False) -> Config:
    """Return a copy of ``cfg`` that trains on XLA devices through mmengine's FlexibleRunner.

    Sets ``runner_type='FlexibleRunner'`` (``'vit_plugin.FlexibleRunner'`` for a config that names
    ``vit_plugin.Runner``) and ``strategy=vit_plugin.XLAStrategy``, swaps the
    train / val / test loops for their XLA versions, the optimizer wrapper for
    ``vit_plugin.XLAOptimWrapper`` (``AmpOptimWrapper`` becomes bf16 autocast), and sets
    ``drop_last=True`` on the train dataloader so every batch has the same shape.

    Args:
        cfg (Config): A training config (as for ``tools/train.py``).
        launcher (str): ``'xla'``, ``'pytorch'`` (torchrun) or ``'none'`` (this process only, no
            process group). Defaults to ``'xla'``.
        bf16 (bool): Also run forward passes under bf16 autocast. Defaults to False.
        spmd (bool): One process for all devices, batch and parameters split over a device mesh
            (:mod:`~vit_plugin.xla.spmd`). Defaults to False.
        layer_scan (bool): Run the ViT's blocks as one compiled loop (:mod:`~vit_plugin.xla.scan`).
            Defaults to False.

    Returns:
        Config: The converted config.
    """
    cfg = copy.deepcopy(cfg)
    runner_type = _strip(cfg.get('runner_type'))
    if runner_type not in (None, 'Runner', 'FlexibleRunner', *_VIT_PLUGIN_RUNNERS):
        raise ValueError(f'runner_type={cfg.runner_type!r}: the XLA path runs on mmengine\'s '
                         "FlexibleRunner; use 'vit_plugin.Runner' or remove runner_type from the config.")
    strategy = cfg.get('strategy') or {}
    if strategy and _strip(strategy.get('type')) not in (None, 'vit_plugin.XLAStrategy'):
        raise ValueError(f'strategy={strategy.get("type")!r} cannot run on XLA; remove `strategy` '
                         'from the config (the XLA launcher sets vit_plugin.XLAStrategy).')
    # vit_plugin's runners prepare the run (hooks, device defaults) before building it; their flexible one
    # does the same on XLA. The global batch is applied by `prepare` (see launch_training).
    cfg.runner_type = 'vit_plugin.FlexibleRunner' if runner_type in _VIT_PLUGIN_RUNNERS else 'FlexibleRunner'
    cfg.strategy = dict(strategy, type='vit_plugin.XLAStrategy')
    if spmd:
        cfg.strategy['spmd'] = True
    if layer_scan:
        require_scan_support(spmd)
        backbone = cfg.model.get('backbone') or {}
        if str(backbone.get('type', '')).split('.')[-1] in ('ViT', 'HybridViT'):
            # Refuse before any process starts: build the backbone on the meta device (no memory).
            from mmengine.registry import MODELS
            with torch.device('meta'):
                check_scannable(MODELS.build(copy.deepcopy(backbone)), 'model.backbone')
        cfg.strategy['layer_scan'] = True
    cfg.launcher = launcher
    cfg.pop('model_wrapper_cfg', None)  # DDP settings; XLA all-reduces in the optimizer step
    # FlexibleRunner.from_cfg passes env_cfg=None through when the config has none, and fails.
    cfg.env_cfg = cfg.get('env_cfg') or dict()
    if cfg.env_cfg.get('dist_cfg'):
        cfg.env_cfg.dist_cfg.pop('backend', None)  # e.g. 'nccl' from a GPU runtime config
    if cfg.get('train_cfg'):
        by_epoch = cfg.train_cfg.pop('by_epoch', None)
        default = 'IterBasedTrainLoop' if by_epoch is False else 'EpochBasedTrainLoop'
        cfg.train_cfg = _xla_loop(cfg.train_cfg, default, _TRAIN_LOOPS, 'train_cfg')
        cfg.optim_wrapper = xla_optim_wrapper_cfg(cfg.optim_wrapper)
        if bf16:
            cfg.optim_wrapper['dtype'] = 'bfloat16'
        if not cfg.train_dataloader.get('drop_last', False):
            cfg.train_dataloader['drop_last'] = True
            print_log('XLA: train_dataloader.drop_last set to True (fixed batch shapes).',
                      logger='current', level=logging.INFO)
    for key, default in (('val_cfg', 'ValLoop'), ('test_cfg', 'TestLoop')):
        if cfg.get(key) is not None:
            cfg[key] = _xla_loop(cfg[key], default, _EVAL_LOOPS, key)
    return cfg


def _train_worker(index: int, cfg: Config, launcher: str, bf16: bool,
                  prepare: Optional[Callable], spmd: bool = False, layer_scan: bool = False) -> None:
    """Body of each process started by ``torch_xla.launch``: build the runner and train."""
    from mmengine.registry import RUNNERS
    from mmengine.utils import import_modules_from_strings

    if cfg.get('custom_imports'):  # Config.fromfile imported them in the parent process only
        import_modules_from_strings(**cfg.custom_imports)
    if prepare is not None:
        prepare(cfg, runtime.world_size(), logger=print if runtime.is_master() else None)
    runner = RUNNERS.build(to_xla_config(cfg, launcher=launcher, bf16=bf16, spmd=spmd, layer_scan=layer_scan))
    runner.train()


def launch_training(cfg: Config, bf16: bool = False, prepare: Optional[Callable] = None,
                    spmd: bool = False, layer_scan: bool = False) -> None:
    """Train ``cfg`` on every local XLA device, one process each (``torch_xla.launch``).

    Must run before anything in this process touches the XLA device (torch_xla refuses to spawn
    from an initialised runtime) and before any CPU backward pass (pytorch/xla#4174). Under
    ``torchrun``, and with ``PJRT_DEVICE=CPU`` (one replica), the current process trains directly.

    Args:
        cfg (Config): The training config (not yet converted by :func:`to_xla_config`).
        bf16 (bool): Run forward passes under bf16 autocast. Defaults to False.
        prepare (callable, optional): ``prepare(cfg, world_size, logger=...)`` run in each process
            once the number of replicas is known, before the runner is built (``tools/train.py``
            passes ``apply_global_batch_size``, which records that it did, so that
            ``vit_plugin.FlexibleRunner`` does not apply it again). Must be importable (it is pickled
            by name). Defaults to None.
        spmd (bool): SPMD mode: this process alone drives every device of the host, with the
            config's batch as the global batch split over them and FSDPv2-sharded parameters
            (:mod:`~vit_plugin.xla.spmd`). Defaults to False.
        layer_scan (bool): Run the ViT's blocks as one compiled loop (:mod:`~vit_plugin.xla.scan`).
            Defaults to False.
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
