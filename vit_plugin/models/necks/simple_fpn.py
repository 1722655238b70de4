"""ViTDet's simple feature pyramid: strides 4-32 (and more) from a plain ViT's stride-16 map(s)."""
from typing import List, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn
import torch.nn.functional as F
from mmengine.model import BaseModule
from mmpretrain.models.utils import LayerNorm2d  # LayerNorm over the channels at every position

from vit_plugin.registry import MODELS


def _norm(kind: str, channels: int, eps: float) -> nn.Module:
    if kind == 'LN':
        return LayerNorm2d(channels, eps=eps)
    groups = next(g for g in (32, 16, 8, 4, 2, 1) if channels % g == 0)
    return nn.GroupNorm(groups, channels, eps=eps)


def _rescale_branch(channels: int, scale: float, norm: str, eps: float) -> Tuple[nn.Module, int]:
    """One resampling branch and its output width (ViTDet: halve the width at every 2x upsampling)."""
    if scale == 4.0:
        half, quarter = channels // 2, channels // 4
        return nn.Sequential(nn.ConvTranspose2d(channels, half, 2, stride=2), _norm(norm, half, eps), nn.GELU(),
                             nn.ConvTranspose2d(half, quarter, 2, stride=2)), quarter
    if scale == 2.0:
        return nn.ConvTranspose2d(channels, channels // 2, 2, stride=2), channels // 2
    if scale == 1.0:
        return nn.Identity(), channels
    if scale == 0.5:
        return nn.MaxPool2d(2, stride=2), channels
    raise ValueError(f'scale factors must be 4.0, 2.0, 1.0 or 0.5, got {scale}')


@MODELS.register_module()
class SimpleFeaturePyramid(BaseModule):
    """ViTDet's simple feature pyramid: multi-scale maps from a plain ViT (docs/detection.md).

    Args:
        in_channels (int): Width D of the ViT maps.
        out_channels (int, optional): Width of every level; None keeps the branch widths
            (:attr:`branch_channels`, for mmdet's ``FPN``). Defaults to 256.
        scale_factors (Sequence[float]): Factor of each branch, from 4.0, 2.0, 1.0, 0.5.
        num_outs (int, optional): Output levels, >= len(scale_factors). None: one per branch.
        norm (str): 'LN' (over channels, ViTDet) or 'GN' (up to 32 groups). Defaults to 'LN'.
        norm_eps (float): Epsilon of the norms. Defaults to 1e-6.
        init_cfg (dict | list[dict], optional): Defaults to Kaiming-uniform convolutions (a=1) with
            zero biases.
    """

    def __init__(self,
                 in_channels: int,
                 out_channels: Optional[int] = 256,
                 scale_factors: Sequence[float] = (4.0, 2.0, 1.0, 0.5),
                 num_outs: Optional[int] = None,
                 norm: str = 'LN',
                 norm_eps: float = 1e-6,
                 init_cfg: Optional[Union[dict, List[dict]]] = dict(
                     type='Kaiming', layer=['Conv2d', 'ConvTranspose2d'], a=1, distribution='uniform',
                     mode='fan_in', nonlinearity='leaky_relu')):
        super().__init__(init_cfg=init_cfg)
        self.scale_factors = tuple(float(s) for s in scale_factors)
        self.num_outs = len(self.scale_factors) if num_outs is None else num_outs
        if self.num_outs < len(self.scale_factors):
            raise ValueError(f'num_outs ({self.num_outs}) must be >= the number of scale factors '
                             f'({len(self.scale_factors)})')
        if norm not in ('LN', 'GN'):
            raise ValueError(f"norm must be 'LN' or 'GN', got {norm!r}")
        branches = [_rescale_branch(in_channels, s, norm, norm_eps) for s in self.scale_factors]
        self.rescale = nn.ModuleList(b for b, _ in branches)
        #: Width of each rescaled map (what mmdet's FPN needs as ``in_channels`` when out_channels=None).
        self.branch_channels = [c for _, c in branches]
        self.out_channels = out_channels
        if out_channels is not None:
            self.project = nn.ModuleList(
                nn.Sequential(nn.Conv2d(c, out_channels, 1, bias=False), _norm(norm, out_channels, norm_eps),
                              nn.Conv2d(out_channels, out_channels, 3, padding=1, bias=False),
                              _norm(norm, out_channels, norm_eps)) for c in self.branch_channels)
        else:
            self.project = None

    def forward(self, inputs: Union[torch.Tensor, Sequence[torch.Tensor]]) -> Tuple[torch.Tensor, ...]:
        """One map or one map per branch, each (B, D, h, w) -> ``num_outs`` maps, finest first."""
        if isinstance(inputs, torch.Tensor):
            inputs = (inputs, )
        if len(inputs) == 1:
            inputs = tuple(inputs) * len(self.rescale)
        elif len(inputs) != len(self.rescale):
            raise ValueError(f'SimpleFeaturePyramid got {len(inputs)} maps for {len(self.rescale)} scale factors; '
                             f'give the backbone out_indices with one index (shared) or one per scale factor')
        outs = [branch(x) for branch, x in zip(self.rescale, inputs)]
        if self.project is not None:
            outs = [proj(x) for proj, x in zip(self.project, outs)]
        while len(outs) < self.num_outs:
            outs.append(F.max_pool2d(outs[-1], kernel_size=1, stride=2))
        # Contiguous NCHW maps: mmcv's CPU RoIAlign reads the raw memory as NCHW, so a map in
        # channels-last memory (what a permute-based LayerNorm leaves behind) gives the RoI heads
        # features of the wrong positions and channels, silently.
        return tuple(x.contiguous() for x in outs)
