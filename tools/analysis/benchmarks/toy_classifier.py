"""The classifier the benchmarks time: a ViT-like backbone plus a linear head on its class token.

:class:`Classifier` takes any backbone whose output tuple ends with the class token (ours, mmpretrain's);
:func:`vit_classifier` builds it around a ``vit_plugin.ViT`` of a given shape, and :class:`LossModel`
wraps it for mmengine's ``Runner`` (its forward returns the cross-entropy loss).
"""
from typing import Optional

import torch.nn as nn
import torch.nn.functional as F
from mmengine.model import BaseModel

from vit_plugin.models.backbones import ViT


class Classifier(nn.Module):
    """A backbone returning a tuple whose last entry is the class token, plus a linear head."""

    def __init__(self, backbone: nn.Module, dims: int, num_classes: int):
        super().__init__()
        self.backbone = backbone
        self.head = nn.Linear(dims, num_classes)

    def forward(self, x):
        return self.head(self.backbone(x)[-1])


def vit_classifier(dims: int, layers: int, heads: int, mlp: int, img_size: int, patch_size: int, num_classes: int,
                   init_weights: bool = False) -> Classifier:
    """A :class:`Classifier` around a ``vit_plugin.ViT`` of that shape (``init_weights``: the ViT's own
    initialisation, else torch's defaults)."""
    backbone = ViT(arch=dict(embed_dims=dims, num_layers=layers, num_heads=heads, mlp_dims=mlp),
                   img_size=img_size, patch_size=patch_size)
    if init_weights:
        backbone.init_weights()
    return Classifier(backbone, dims, num_classes)


class LossModel(BaseModel):
    """An mmengine model around a classifier: ``forward(inputs, labels)`` returns ``{'loss': cross-entropy}``."""

    def __init__(self, classifier: nn.Module, data_preprocessor: Optional[dict] = None):
        super().__init__(data_preprocessor=data_preprocessor)
        self.classifier = classifier

    def forward(self, inputs, labels, mode='loss'):
        return {'loss': F.cross_entropy(self.classifier(inputs), labels)}
