"""Runner hook that adapts position embeddings (and patch kernels) inside a loaded checkpoint dict."""
from typing import Dict, List

import torch
from mmengine.hooks import Hook
from mmengine.logging import print_log
from mmengine.model import is_model_wrapper
from mmengine.optim import OptimWrapperDict

from vit_plugin.models import ViT
from vit_plugin.models.load_adapt import adapt_vit_state_dict
from vit_plugin.registry import HOOKS


@HOOKS.register_module()
class PosEmbedResizeHook(Hook):
    """Resize position embeddings and patch kernels in the checkpoint dict as soon as the runner reads it.

    Covers ``load_from`` and ``--resume``; the optimizer state of a resized parameter is reset (logged).
    See docs/checkpoints.md#position-embedding-resize.

    Args:
        reset_optimizer_state (bool): Reset the optimizer state of parameters whose shape changed.
            Defaults to True. With False, resuming with changed shapes fails at the first step.
    """
    priority = 'VERY_HIGH'

    def __init__(self, reset_optimizer_state: bool = True):
        self.reset_optimizer_state = reset_optimizer_state

    def after_load_checkpoint(self, runner, checkpoint: dict) -> None:
        model = runner.model.module if is_model_wrapper(runner.model) else runner.model
        state_dict = checkpoint.get('state_dict', checkpoint)
        changed: Dict[str, torch.nn.Parameter] = {}
        for name, module in model.named_modules():
            if not isinstance(module, ViT):
                continue
            prefix = f'{name}.' if name else ''
            if prefix + 'pos_embed' not in state_dict and 'module.' + prefix + 'pos_embed' in state_dict:
                prefix = 'module.' + prefix  # saved from a DDP-wrapped model; mmengine strips it later
            params = {prefix + 'pos_embed': module.pos_embed, prefix + 'patch_embed.proj.weight':
                      module.patch_embed.proj.weight}
            before = {k: state_dict[k].shape for k in params if k in state_dict}
            adapt_vit_state_dict(module, state_dict, prefix)
            changed.update({k: params[k] for k, shape in before.items() if state_dict[k].shape != shape})
        if changed and self.reset_optimizer_state and isinstance(checkpoint.get('optimizer'), dict):
            self._reset_optimizer_state(runner, checkpoint['optimizer'], changed)

    @staticmethod
    def _reset_optimizer_state(runner, optim_state: dict, changed: Dict[str, torch.nn.Parameter]) -> None:
        wrapper = runner.optim_wrapper
        if isinstance(wrapper, OptimWrapperDict):
            pairs = [(wrapper[name].optimizer, optim_state.get(name)) for name in wrapper.keys()]
        elif hasattr(wrapper, 'optimizer'):
            pairs = [(wrapper.optimizer, optim_state)]
        else:
            print_log('PosEmbedResizeHook: the optimizer is not built yet, so the optimizer state of the resized '
                      f'parameters {sorted(changed)} could not be reset; resuming may fail.', logger='current',
                      level=30)
            return
        for optimizer, saved in pairs:
            if not saved or 'state' not in saved or 'param_groups' not in saved:
                continue
            current: List[torch.Tensor] = [p for group in optimizer.param_groups for p in group['params']]
            saved_ids = [i for group in saved['param_groups'] for i in group['params']]
            for key, param in changed.items():
                position = next((j for j, p in enumerate(current) if p is param), None)
                if position is None or position >= len(saved_ids):
                    continue
                if saved['state'].pop(saved_ids[position], None) is not None:
                    print_log(f'PosEmbedResizeHook: reset the optimizer state of "{key}" because the checkpoint '
                              f'tensor was resized to the model\'s shape {tuple(param.shape)}.', logger='current')
