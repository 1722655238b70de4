"""Find a sub-module wherever it sits in a model (classifier, detector, self-supervised wrapper)."""
from typing import Callable, Optional, Tuple

import torch.nn as nn

from vit_plugin.models.backbones.vit import ViT


class WrongModelError(ValueError):
    """The config or checkpoint is not (or does not fit) a vit_plugin ViT."""


def find_module(model: nn.Module, predicate: Callable[[nn.Module], bool]) -> Optional[Tuple[str, nn.Module]]:
    """``(name + '.', module)`` ('' for ``model`` itself) of the first of ``model.named_modules()`` where
    ``predicate`` holds, or None."""
    for name, module in model.named_modules():
        if predicate(module):
            return (f'{name}.' if name else ''), module
    return None


def find_vit(model: nn.Module) -> Tuple[nn.Module, str]:
    """The first :class:`vit_plugin.ViT` (or subclass, e.g. the hybrid) inside ``model`` and its prefix."""
    found = find_module(model, lambda module: isinstance(module, ViT))
    if found is None:
        raise WrongModelError(f'the model ({type(model).__name__}) contains no vit_plugin.ViT backbone; these tools '
                              f'analyse ViT models: use a config whose backbone is type="vit_plugin.ViT" (or '
                              f'"vit_plugin.HybridViT")')
    prefix, vit = found
    return vit, prefix
