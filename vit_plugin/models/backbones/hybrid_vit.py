"""The paper's hybrid model: a ResNet feature map fed to ViT as a 'patch' sequence (R50+ViT-B/16)."""
from typing import List, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn

from vit_plugin.registry import MODELS
from ..layers import lecun_normal_, pad_to_patch_multiple
from ..resnet_stem import Bottleneck, StdConv2dSame, build_resnet, resnet_reduction
from .vit import ViT
from .vit_options import PatchSettings


class HybridEmbed(nn.Module):
    """ResNet ``backbone`` then a patch projection of its feature map; ``padding`` as :class:`ViT`'s."""

    def __init__(self, backbone: nn.Module, patch_size: Tuple[int, int], embed_dims: int,
                 padding: Optional[str] = None, bias: bool = True):
        super().__init__()
        self.backbone = backbone
        self.patch_size = tuple(patch_size)
        self.padding = padding
        self.proj = nn.Conv2d(backbone.out_channels, embed_dims, kernel_size=self.patch_size, stride=self.patch_size,
                              bias=bias)

    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, Tuple[int, int]]:
        """(B, C, H, W) -> tokens (B, h*w, D) and their grid (h, w)."""
        x = self.backbone(x)
        h, w = x.shape[-2:]
        ph, pw = self.patch_size
        if h % ph or w % pw:
            if self.padding is None:
                raise ValueError(f'the ResNet feature map is {h}x{w}, not divisible by the patch size {ph}x{pw}; '
                                 f'use an input whose size gives a divisible feature map, or build the '
                                 f'backbone with pad_to_patch=True')
            x = pad_to_patch_multiple(x, self.patch_size, self.padding)
        x = self.proj(x)
        grid = (x.shape[2], x.shape[3])
        return x.flatten(2).transpose(1, 2), grid


@MODELS.register_module()
class HybridViT(ViT):
    """R50+ViT hybrid: tokens from the official ResNet's feature map, the rest :class:`ViT` (timm's names).

    See docs/backbone.md#r50vit-hybrid.

    Args:
        arch (str | dict): ViT arch, see :class:`ViT`. Defaults to 'base'.
        layers (Sequence[int]): Bottleneck units per ResNet stage: (3, 4, 9) for R50 (feature map 1/16
            of the image), () for the stem-only R+Ti (1/4). Defaults to (3, 4, 9).
        patch_size (int | tuple[int, int]): Patch size on the feature map. Defaults to 1.
        width_factor (int): ResNet width multiplier. Defaults to 1.
        ws_eps (float): Weight-standardisation eps. Defaults to 1e-5 (official).
        resnet_norm_eps (float): ResNet GroupNorm eps. Defaults to 1e-6 (official).
        num_groups (int): ResNet GroupNorm groups. Defaults to 32.
        **kwargs: Everything else :class:`ViT` takes.
    """

    def __init__(self,
                 arch: Union[str, dict] = 'base',
                 layers: Sequence[int] = (3, 4, 9),
                 patch_size: Union[int, Sequence[int]] = 1,
                 in_channels: int = 3,
                 width_factor: int = 1,
                 ws_eps: float = 1e-5,
                 resnet_norm_eps: float = 1e-6,
                 num_groups: int = 32,
                 init_cfg: Optional[Union[dict, List[dict]]] = None,
                 **kwargs):
        self.resnet_layers = tuple(layers)
        self._resnet_kwargs = dict(width_factor=width_factor, num_groups=num_groups, norm_eps=resnet_norm_eps,
                                   ws_eps=ws_eps)
        super().__init__(arch=arch, patch_size=patch_size, in_channels=in_channels, init_cfg=init_cfg, **kwargs)

    def _build_patch_embed(self, patch: PatchSettings) -> nn.Module:
        resnet = build_resnet(self.resnet_layers, patch.in_channels, **self._resnet_kwargs)
        return HybridEmbed(resnet, self.patch_size, self.embed_dims, padding=self.patch_padding, bias=patch.bias)

    def _grid_for(self, img_size: Tuple[int, int]) -> Tuple[int, int]:
        feat = [resnet_reduction(s, len(self.resnet_layers)) for s in img_size]
        return (self._patches_along(feat[0], self.patch_size[0]), self._patches_along(feat[1], self.patch_size[1]))

    def _pad_or_check(self, x: torch.Tensor) -> torch.Tensor:
        # 'SAME' padding lets the ResNet take any size; divisibility matters only on its feature map,
        # which HybridEmbed checks (or pads).
        return x

    def init_weights(self):
        """Official initialisation unless ``init_cfg`` loads weights: the ViT part as :meth:`ViT.init_weights`,
        ResNet convs LeCun-normal, GroupNorms (1, 0) except each bottleneck's last (scale 0).
        """
        super().init_weights()
        if self.init_cfg is not None:
            return
        for module in self.patch_embed.backbone.modules():
            if isinstance(module, StdConv2dSame):
                lecun_normal_(module.weight)
            elif isinstance(module, nn.GroupNorm):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)
        for module in self.patch_embed.backbone.modules():
            if isinstance(module, Bottleneck):
                nn.init.zeros_(module.norm3.weight)
