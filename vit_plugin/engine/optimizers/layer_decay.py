"""Layer-wise learning-rate decay for ViT backbones, in classifiers and detectors alike: depth ``d`` trains
at ``base_lr * rate ** (max_depth - d)``, modules outside the backbone at the full rate. See
docs/detection.md.
"""
from collections import defaultdict
from typing import List, Optional, Tuple

import torch.nn as nn
from mmengine.logging import print_log
from mmengine.optim import DefaultOptimWrapperConstructor

from vit_plugin.compat import torch as torch_compat
from vit_plugin.models.vit_search import find_module
from vit_plugin.registry import OPTIM_WRAPPER_CONSTRUCTORS

_NORMS = (nn.LayerNorm, nn.GroupNorm, torch_compat.BatchNormBase, torch_compat.InstanceNormBase)


def find_layer_depth_module(model: nn.Module) -> Tuple[str, nn.Module]:
    """``(prefix, module)`` of the first module (the model itself first) with ``get_layer_depth``.

    Raises:
        TypeError: No module has it.
    """
    found = find_module(model, lambda module: callable(getattr(module, 'get_layer_depth', None)))
    if found is None:
        raise TypeError(f'layer-wise lr decay needs a module with get_layer_depth(param_name, prefix) in '
                        f'{type(model).__name__} (e.g. vit_plugin.ViT as the backbone); none was found. Use '
                        f"mmengine's DefaultOptimWrapperConstructor for models without one.")
    return found


@OPTIM_WRAPPER_CONSTRUCTORS.register_module()
class LayerDecayOptimWrapperConstructor(DefaultOptimWrapperConstructor):
    """Optimizer-wrapper constructor with layer-wise lr decay and ViT-style weight-decay exemptions.

    Parameters are grouped by (depth, weight decay), top (full lr) first, so the logged ``lr`` is the base one.

    ``paramwise_cfg`` keys:

    - ``layer_decay_rate`` (float): Decay per depth, in (0, 1]. Defaults to 1.0 (no decay).
    - ``decay_norm_and_bias`` (bool): Apply weight decay to norm parameters and biases (all 1-D
      parameters). Defaults to False: they, and the backbone's ``no_weight_decay()`` names, get none.
    - ``custom_keys`` (dict): Substring of a parameter name -> ``dict(lr_mult=..., decay_mult=...)``,
      applied on top of the rules above (longest matching key wins).
    - ``strict_custom_keys`` (bool): A custom key that matches no parameter is an error instead of a
      warning.

    Example::

        optim_wrapper = dict(
            type='AmpOptimWrapper',
            optimizer=dict(type='AdamW', lr=1e-4, betas=(0.9, 0.999), weight_decay=0.1),
            constructor='vit_plugin.LayerDecayOptimWrapperConstructor',
            paramwise_cfg=dict(layer_decay_rate=0.7))
    """

    def __init__(self, optim_wrapper_cfg: dict, paramwise_cfg: Optional[dict] = None):
        paramwise_cfg = dict(paramwise_cfg or {})
        unknown = set(paramwise_cfg) - {'layer_decay_rate', 'decay_norm_and_bias', 'custom_keys', 'strict_custom_keys'}
        if unknown:
            raise KeyError(f'LayerDecayOptimWrapperConstructor: unknown paramwise_cfg keys {sorted(unknown)}; '
                           f'supported: layer_decay_rate, decay_norm_and_bias, custom_keys, strict_custom_keys')
        paramwise_cfg.setdefault('layer_decay_rate', 1.0)  # non-empty: mmengine then calls add_params
        super().__init__(optim_wrapper_cfg, paramwise_cfg)
        if self.base_lr is None:
            raise ValueError('LayerDecayOptimWrapperConstructor needs optimizer.lr in the config')
        self.decay_rate = float(paramwise_cfg['layer_decay_rate'])
        if not 0 < self.decay_rate <= 1:
            raise ValueError(f'layer_decay_rate must be in (0, 1], got {self.decay_rate}')

    def add_params(self, params: List[dict], module: nn.Module, prefix: str = '', **kwargs) -> None:
        """Fill ``params`` with one group per (depth, weight decay, custom key) of ``module``."""
        depth_prefix, depth_module = find_layer_depth_module(module)
        # mmpretrain classifiers take (name) and add the backbone prefix themselves; backbones take
        # (name, prefix).
        if depth_prefix:
            get_depth = lambda name: depth_module.get_layer_depth(name, depth_prefix)  # noqa: E731
        else:
            get_depth = depth_module.get_layer_depth
        no_wd = {(owner + '.' if owner else '') + name
                 for owner, sub in module.named_modules() if callable(getattr(sub, 'no_weight_decay', None))
                 for name in sub.no_weight_decay()}
        norm_params = {id(p) for m in module.modules() if isinstance(m, _NORMS) for p in m.parameters(False)}
        custom_keys = self.paramwise_cfg.get('custom_keys', {})
        sorted_keys = sorted(sorted(custom_keys), key=len, reverse=True)
        decay_all = self.paramwise_cfg.get('decay_norm_and_bias', False)
        base_wd = self.base_wd or 0.

        groups = defaultdict(lambda: dict(params=[], param_names=[]))
        for name, param in module.named_parameters():
            if not param.requires_grad:
                continue
            depth, num_depths = get_depth(name)
            scale = self.decay_rate**(num_depths - 1 - depth)
            exempt = name in no_wd or (not decay_all and (param.ndim == 1 or id(param) in norm_params))
            wd = 0. if exempt else base_wd
            key = next((k for k in sorted_keys if k in name), None)
            if key is not None:
                scale *= custom_keys[key].get('lr_mult', 1.)
                wd *= custom_keys[key].get('decay_mult', 1.)
            group = groups[(depth, wd, scale, key)]
            group.update(lr=self.base_lr * scale, weight_decay=wd, lr_scale=scale, layer_id=depth)
            group['params'].append(param)
            group['param_names'].append(name)
        ordered = sorted(groups.values(), key=lambda g: (-g['layer_id'], -g['lr'], -g['weight_decay']))
        params.extend(ordered)
        self._log_groups(ordered)

    @staticmethod
    def _log_groups(groups: List[dict]) -> None:
        lines = [f'Layer-wise lr decay: {len(groups)} parameter groups (depth, lr, weight decay, tensors):']
        for g in groups:
            lines.append(f'  depth {g["layer_id"]:>2}  lr={g["lr"]:.4g} (x{g["lr_scale"]:.4g})  '
                         f'wd={g["weight_decay"]:.4g}  {len(g["params"]):>3} tensors, e.g. {g["param_names"][0]}')
        print_log('\n'.join(lines), logger='current')
