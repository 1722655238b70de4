"""Weight averaging (EMA) of a model sharded with FSDP2: the average is kept on a mirror of each
process's shards. See docs/scaling.md#sharded-training-with-fsdp2.
"""
from typing import Dict

import torch
import torch.nn as nn
from mmengine.hooks import EMAHook
from mmengine.model import is_model_wrapper
from mmengine.registry import MODELS

from vit_plugin.compat import torch as torch_compat
from vit_plugin.registry import HOOKS


def mirror_tensors(model: nn.Module) -> nn.Module:
    """A plain module tree with ``model``'s names and order, holding detached copies of its parameters and buffers."""
    nodes = {}
    for name, module in model.named_modules(remove_duplicate=False):
        node = nodes[name] = nn.Module()
        non_persistent = torch_compat.non_persistent_buffers(module)
        if name:
            parent, _, child = name.rpartition('.')
            nodes[parent].add_module(child, node)
        for key, param in module.named_parameters(recurse=False):
            node.register_parameter(key, nn.Parameter(param.detach().clone(), requires_grad=False))
        for key, buffer in module.named_buffers(recurse=False):
            node.register_buffer(key, buffer.detach().clone(),
                                 persistent=key not in non_persistent)
    return nodes['']


@HOOKS.register_module()
class ShardedEMAHook(EMAHook):
    """mmengine's ``EMAHook`` for models that cannot be deep-copied (FSDP2); same arguments.

    The averaged model (``ema_type``, default ``ExponentialMovingAverage``) is built on
    :func:`mirror_tensors` of the model instead of a copy of it.
    """

    ema_model = None

    def before_run(self, runner) -> None:
        if self.ema_model is None:
            self._build(runner)

    def _build(self, runner) -> None:
        model = runner.model.module if is_model_wrapper(runner.model) else runner.model
        self.src_model = model
        mirror = mirror_tensors(model)
        self.ema_model = MODELS.build(self.ema_cfg, default_args=dict(model=mirror))

    def after_load_checkpoint(self, runner, checkpoint: dict) -> None:
        # mmengine's FlexibleRunner resumes before it calls ``before_run``: build the average first.
        if self.ema_model is None:
            self._build(runner)
        super().after_load_checkpoint(runner, checkpoint)

    def _swap_ema_parameters(self) -> None:
        # Paired by name (the mirror has no modules of its own for parameter-free layers).
        averaged: Dict[str, torch.Tensor] = dict(self.ema_model.module.named_parameters())
        source = dict(self.src_model.named_parameters())
        if self.ema_model.update_buffers:
            averaged.update(self.ema_model.module.named_buffers())
            source.update(self.src_model.named_buffers())
        for name, avg in averaged.items():
            src = source[name]
            tmp = avg.data.clone()
            avg.data.copy_(src.data)
            src.data.copy_(tmp)
