"""Prediction head and loss of masked patch prediction."""
import math
from typing import Dict, Optional, Union

import torch
import torch.nn as nn
import torch.nn.functional as F
from mmengine.model import BaseModule

from vit_plugin.registry import MODELS
from ..pos_embed import to_2tuple
from .targets import TARGETS


@MODELS.register_module()
class MPPHead(BaseModule):
    """Linear prediction of the MPP target from each corrupted patch's token (docs/mpp.md).

    Args:
        in_channels (int): Width D of the backbone's tokens. Defaults to 768.
        target (str): One of :data:`~vit_plugin.models.selfsup.targets.TARGETS`.
            Defaults to 'mean_color_3bit'.
        patch_size (int | tuple[int, int]): The backbone's patch size. Defaults to 16.
        img_channels (int): Colour channels. Defaults to 3.
        color_bits (int): Bits per channel of the colour classes. Defaults to 3.
        cells (int): Side of the downsized grid of ``'downsized_4x4_3bit'``. Defaults to 4.
        loss_weight (float): Multiplier of the loss. Defaults to 1.
        init_cfg (dict, optional): Defaults to None: Xavier-uniform weight, zero bias.
    """

    def __init__(self,
                 in_channels: int = 768,
                 target: str = 'mean_color_3bit',
                 patch_size: Union[int, tuple] = 16,
                 img_channels: int = 3,
                 color_bits: int = 3,
                 cells: int = 4,
                 loss_weight: float = 1.,
                 init_cfg: Optional[dict] = None):
        super().__init__(init_cfg=init_cfg)
        if target not in TARGETS:
            raise ValueError(f'unknown MPP target {target!r}; choose one of {TARGETS}')
        self.target = target
        self.patch_size = to_2tuple(patch_size)
        self.img_channels = img_channels
        self.color_bits = color_bits
        self.cells = cells
        self.loss_weight = loss_weight
        self.num_classes = 2**(color_bits * img_channels)
        if target == 'mean_color_3bit':
            self.out_shape = (self.num_classes, )
        elif target == 'downsized_4x4_3bit':
            self.out_shape = (cells * cells, self.num_classes)
        else:
            self.out_shape = (self.patch_size[0] * self.patch_size[1] * img_channels, )
        self.fc = nn.Linear(in_channels, math.prod(self.out_shape))

    @property
    def is_classification(self) -> bool:
        return self.target != 'pixel_l2'

    def init_weights(self):
        if self.init_cfg is not None:
            super().init_weights()
            return
        nn.init.xavier_uniform_(self.fc.weight)
        nn.init.zeros_(self.fc.bias)

    def forward(self, latent: torch.Tensor) -> torch.Tensor:
        """Tokens (B, K, D) -> predictions (B, K, *out_shape): logits, or pixels in [-1, 1] units."""
        return self.fc(latent).reshape(*latent.shape[:-1], *self.out_shape)

    def loss(self, latent: torch.Tensor, target: torch.Tensor) -> Dict[str, torch.Tensor]:
        """Tokens (B, K, D) against targets -> ``loss`` (CE, or MSE for ``'pixel_l2'``), ``acc`` for classes."""
        pred = self(latent)
        if not self.is_classification:
            return dict(loss=self.loss_weight * F.mse_loss(pred.float(), target.float()))
        logits = pred.float().reshape(-1, self.num_classes)
        labels = target.reshape(-1)
        loss = F.cross_entropy(logits, labels)
        with torch.no_grad():
            acc = (logits.argmax(dim=-1) == labels).float().mean() * 100.
        return dict(loss=self.loss_weight * loss, acc=acc)

