"""``vit_plugin.XLAStrategy``: mmengine's FlexibleRunner strategy for XLA (docs/scaling.md#tpus-with-torch_xla)."""
import copy
import logging
from typing import Callable, Optional, Union

import torch.nn as nn
from mmengine.logging import print_log
from mmengine.model import revert_sync_batchnorm
from mmengine.optim import BaseOptimWrapper

from vit_plugin.engine.optimizers.nonfinite_step import UNGUARDED_TYPES, wrapper_type_name

from vit_plugin.compat import mmengine as mmengine_compat
from vit_plugin.engine.checkpointing import PARTIAL_SUFFIX, publish_partial
from vit_plugin.registry import STRATEGIES

from . import runtime, spmd
from .optim_wrapper import XLAOptimWrapper
from .scan import enable_layer_scan

XLA_OPTIM_WRAPPER = 'vit_plugin.XLAOptimWrapper'


def xla_optim_wrapper_cfg(cfg: dict) -> dict:
    """An ``optim_wrapper`` config translated for :class:`~vit_plugin.xla.XLAOptimWrapper`: ``AmpOptimWrapper``
    becomes bf16 autocast, guarded types ``nonfinite_guard=True``; an XLA config is returned unchanged.
    """
    cfg = copy.deepcopy(dict(cfg))
    kind = cfg.get('type')
    name = wrapper_type_name(kind)
    if name == 'XLAOptimWrapper':
        return cfg
    guarded = name in UNGUARDED_TYPES
    plain = UNGUARDED_TYPES[name].split('.')[-1] if guarded else name
    if plain == 'OptimWrapper':
        cfg['type'] = XLA_OPTIM_WRAPPER
    elif plain == 'AmpOptimWrapper':
        dtype = str(cfg.pop('dtype', 'bfloat16') or 'bfloat16').replace('torch.', '')
        if dtype not in ('bfloat16', 'bf16'):
            raise ValueError(f'optim_wrapper: {name} with dtype={dtype!r} cannot run on XLA; '
                             "use dtype='bfloat16' (TPUs compute in bf16 without loss scaling).")
        for key in ('loss_scale', 'use_fsdp'):
            cfg.pop(key, None)
        cfg.update(type=XLA_OPTIM_WRAPPER, dtype='bfloat16')
    else:
        raise ValueError(f'optim_wrapper: type={kind!r} has no XLA equivalent. Use OptimWrapper, '
                         'AmpOptimWrapper (bf16), their vit_plugin.Guarded* types or vit_plugin.XLAOptimWrapper.')
    if guarded:
        cfg['nonfinite_guard'] = True
    return cfg


@STRATEGIES.register_module()
class XLAStrategy(mmengine_compat.SingleDeviceStrategy):
    """Run the model on the XLA device of this process, without a DDP wrapper.

    Args:
        spmd (bool): One process drives every device of the host; the process must have called
            :func:`vit_plugin.xla.spmd.enable` first. Defaults to False.
        layer_scan (bool): Run the ViT's blocks as one compiled loop. Defaults to False.
        **kwargs: As mmengine's ``BaseStrategy``.

    Attributes:
        mesh: The SPMD device mesh (None without SPMD).
        param_specs (dict): SPMD only: parameter name -> partition spec (None: replicated).
    """

    xla_group = None
    mesh = None

    def __init__(self, spmd: bool = False, layer_scan: bool = False, **kwargs):
        super().__init__(**kwargs)
        self.spmd = spmd
        self.layer_scan = layer_scan
        self.param_specs = {}

    def _setup_distributed(self, launcher: str = 'xla', backend: Optional[str] = None, **kwargs):
        """Join the XLA replicas (``'xla'`` or torchrun): a Gloo default group, an ``xla`` group for tensors."""
        import torch.distributed as dist
        if launcher not in ('xla', 'pytorch'):
            raise ValueError(f"XLAStrategy: launcher={launcher!r} is not supported; use 'xla' "
                             "(tools/train.py --launcher xla) or 'pytorch' (torchrun).")
        if backend not in (None, 'xla', 'gloo'):
            print_log(f'XLAStrategy: dist_cfg backend={backend!r} ignored; device collectives use '
                      'XLA and host-side ones gloo.', logger='current', level=logging.INFO)
        runtime.require('torch_xla.distributed.xla_backend')  # registers 'xla' and 'xla://'
        if not dist.is_initialized():
            dist.init_process_group('gloo', init_method='xla://', **kwargs)
        self.xla_group = dist.new_group(backend='xla')

    def _set_randomness(self, seed: Optional[int] = None, diff_rank_seed: bool = False,
                        deterministic: bool = False) -> None:
        super()._set_randomness(seed=seed, diff_rank_seed=diff_rank_seed, deterministic=deterministic)
        self.seed_device(self._seed)

    def seed_device(self, seed: int) -> None:
        """Seed XLA's own generator, which ``torch.manual_seed`` does not reach."""
        runtime.require('torch_xla').manual_seed(seed)

    def compile_model(self, model: nn.Module, compile: Union[dict, bool] = False) -> nn.Module:
        if compile:
            print_log('XLAStrategy: cfg.compile is ignored; XLA already compiles the whole step.',
                      logger='current', level=logging.WARNING)
        return model

    def convert_model(self, model: nn.Module) -> nn.Module:
        # torch's SyncBatchNorm runs on CUDA/NCCL only: on XLA, BatchNorm statistics stay per replica.
        return revert_sync_batchnorm(model)

    def _wrap_model(self, model: nn.Module) -> nn.Module:
        model = self.convert_model(model).to(runtime.device())
        if self.spmd:
            if not spmd.is_enabled():
                raise RuntimeError('XLAStrategy(spmd=True) needs torch_xla in SPMD mode, switched on before '
                                   'the device is first used: vit_plugin.xla.spmd.enable() (tools/train.py '
                                   '--launcher xla --xla-spmd does it).')
            self.mesh = spmd.build_mesh()
            runtime.require('torch_xla.distributed.spmd').set_global_mesh(self.mesh)
            self.param_specs = spmd.shard_parameters(model, self.mesh)
            spmd.shard_preprocessed_batches(model, self.mesh)
            sharded = sum(spec is not None for spec in self.param_specs.values())
            print_log(f'XLA SPMD: {self.mesh.size()} devices on one mesh axis; batch and {sharded} of '
                      f'{len(self.param_specs)} parameter tensors split over it (the rest replicated).',
                      logger='current', level=logging.INFO)
        if self.layer_scan:
            enable_layer_scan(model)
        return model

    def build_optim_wrapper(self, optim_wrapper, model: Optional[nn.Module] = None):
        if isinstance(optim_wrapper, dict) and ('optimizer' in optim_wrapper
                                                 or 'constructor' in optim_wrapper):
            optim_wrapper = xla_optim_wrapper_cfg(optim_wrapper)
        wrapper = super().build_optim_wrapper(optim_wrapper, model)
        if isinstance(wrapper, BaseOptimWrapper) and not isinstance(wrapper, XLAOptimWrapper):
            print_log(f'XLAStrategy: {type(wrapper).__name__} does not all-reduce gradients across '
                      'XLA replicas; use vit_plugin.XLAOptimWrapper for data-parallel training.',
                      logger='current', level=logging.WARNING)
        return wrapper

    # --- checkpoints -----------------------------------------------------------------------------

    def model_state_dict(self) -> dict:
        return runtime.to_cpu(self.model.state_dict())

    def optim_state_dict(self) -> dict:
        return runtime.to_cpu(super().optim_state_dict())

    def save_checkpoint(self, filename: str, *, save_optimizer: bool = True,
                        save_param_scheduler: bool = True, extra_ckpt: Optional[dict] = None,
                        callback: Optional[Callable] = None) -> None:
        """Save a CPU-only checkpoint from the global master, atomically (others return)."""
        if not runtime.is_master():
            return
        local = mmengine_compat.is_local_uri(filename)
        target = str(filename) + PARTIAL_SUFFIX if local else filename
        super().save_checkpoint(target, save_optimizer=save_optimizer, save_param_scheduler=save_param_scheduler,
                                extra_ckpt=extra_ckpt, callback=callback)
        if local:
            publish_partial(target, str(filename))

    def load_checkpoint(self, filename: str, *, map_location: Union[str, Callable] = 'cpu',
                        strict: bool = False, revise_keys: list = [(r'^module.', '')],
                        callback: Optional[Callable] = None) -> dict:
        """Load through the CPU (``'default'`` means CPU here), then copy onto the device."""
        if map_location == 'default':
            map_location = 'cpu'
        return super().load_checkpoint(filename, map_location=map_location, strict=strict,
                                       revise_keys=revise_keys, callback=callback)
