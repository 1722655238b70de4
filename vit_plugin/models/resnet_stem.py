"""The ResNet of the paper's hybrid models, names as timm's ``ResNetV2`` (docs/backbone.md#r50vit-hybrid)."""
import math
from typing import Sequence, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F


def same_padding(size: int, kernel: int, stride: int) -> Tuple[int, int]:
    """TensorFlow 'SAME' padding (before, after) of one dimension; the odd entry goes after."""
    total = max((math.ceil(size / stride) - 1) * stride + kernel - size, 0)
    return total // 2, total - total // 2


def pad_same(x: torch.Tensor, kernel: Tuple[int, int], stride: Tuple[int, int],
             value: float = 0.) -> torch.Tensor:
    """Pad a (B, C, H, W) tensor so a VALID op with ``kernel``/``stride`` behaves like TF 'SAME'."""
    top, bottom = same_padding(x.shape[-2], kernel[0], stride[0])
    left, right = same_padding(x.shape[-1], kernel[1], stride[1])
    if top or bottom or left or right:
        x = F.pad(x, (left, right, top, bottom), value=value)
    return x


def standardize_weight(weight: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    """Official weight standardisation ``(w - mean) / (std + eps)`` over (in, kh, kw), biased std."""
    std, mean = torch.std_mean(weight, dim=(1, 2, 3), unbiased=False, keepdim=True)
    return (weight - mean) / (std + eps)


class StdConv2dSame(nn.Conv2d):
    """Bias-free, weight-standardised conv (``eps`` added to the std) with TF 'SAME' padding."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, stride: int = 1,
                 eps: float = 1e-5):
        super().__init__(in_channels, out_channels, kernel_size, stride=stride, padding=0, bias=False)
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = pad_same(x, self.kernel_size, self.stride)
        return F.conv2d(x, standardize_weight(self.weight, self.eps), None, self.stride)

    def extra_repr(self) -> str:
        return super().extra_repr() + f', eps={self.eps}, padding=SAME'


class MaxPool2dSame(nn.Module):
    """Max-pool with TF 'SAME' padding (padded entries are -inf)."""

    def __init__(self, kernel_size: int = 3, stride: int = 2):
        super().__init__()
        self.kernel_size = (kernel_size, kernel_size)
        self.stride = (stride, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = pad_same(x, self.kernel_size, self.stride, value=float('-inf'))
        return F.max_pool2d(x, self.kernel_size, self.stride)

    def extra_repr(self) -> str:
        return f'kernel_size={self.kernel_size}, stride={self.stride}, padding=SAME'


def _group_norm(channels: int, num_groups: int, eps: float) -> nn.GroupNorm:
    return nn.GroupNorm(num_groups, channels, eps=eps)


class ResNetStem(nn.Module):
    """Root block: StdConv 7x7/2 -> GroupNorm -> ReLU -> max-pool 3x3/2, all 'SAME' (stride 4)."""

    def __init__(self, in_channels: int = 3, out_channels: int = 64, num_groups: int = 32, norm_eps: float = 1e-6,
                 ws_eps: float = 1e-5):
        super().__init__()
        self.conv = StdConv2dSame(in_channels, out_channels, 7, stride=2, eps=ws_eps)
        self.norm = _group_norm(out_channels, num_groups, norm_eps)
        self.pool = MaxPool2dSame(3, 2)
        self.out_channels = out_channels

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pool(F.relu(self.norm(self.conv(x))))


class Downsample(nn.Module):
    """Projection shortcut: StdConv 1x1 (with the unit's stride) -> GroupNorm, no activation."""

    def __init__(self, in_channels: int, out_channels: int, stride: int, num_groups: int, norm_eps: float,
                 ws_eps: float):
        super().__init__()
        self.conv = StdConv2dSame(in_channels, out_channels, 1, stride=stride, eps=ws_eps)
        self.norm = _group_norm(out_channels, num_groups, norm_eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.conv(x))


class Bottleneck(nn.Module):
    """Post-activation bottleneck ``relu(shortcut + gn3(conv3(...)))`` of width F (4F out), stride on the 3x3."""

    def __init__(self, in_channels: int, width: int, stride: int = 1, num_groups: int = 32, norm_eps: float = 1e-6,
                 ws_eps: float = 1e-5):
        super().__init__()
        out_channels = 4 * width
        # Same rule as the official unit: project when the shape changes.
        self.downsample = (Downsample(in_channels, out_channels, stride, num_groups, norm_eps, ws_eps)
                           if in_channels != out_channels or stride != 1 else None)
        self.conv1 = StdConv2dSame(in_channels, width, 1, eps=ws_eps)
        self.norm1 = _group_norm(width, num_groups, norm_eps)
        self.conv2 = StdConv2dSame(width, width, 3, stride=stride, eps=ws_eps)
        self.norm2 = _group_norm(width, num_groups, norm_eps)
        self.conv3 = StdConv2dSame(width, out_channels, 1, eps=ws_eps)
        self.norm3 = _group_norm(out_channels, num_groups, norm_eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shortcut = x if self.downsample is None else self.downsample(x)
        y = F.relu(self.norm1(self.conv1(x)))
        y = F.relu(self.norm2(self.conv2(y)))
        y = self.norm3(self.conv3(y))
        return F.relu(shortcut + y)


class ResNetStage(nn.Module):
    """``depth`` bottleneck units; the first one carries the stride and the projection."""

    def __init__(self, in_channels: int, width: int, depth: int, stride: int, **kwargs):
        super().__init__()
        self.blocks = nn.Sequential(*[
            Bottleneck(in_channels if i == 0 else 4 * width, width, stride if i == 0 else 1, **kwargs)
            for i in range(depth)
        ])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.blocks(x)


class ResNetV2Stages(nn.Module):
    """Root block, then stages of ``layers[s]`` units and width ``64 * width_factor * 2**s``."""

    def __init__(self, layers: Sequence[int], in_channels: int = 3, width_factor: int = 1, num_groups: int = 32,
                 norm_eps: float = 1e-6, ws_eps: float = 1e-5):
        super().__init__()
        width = 64 * width_factor
        kwargs = dict(num_groups=num_groups, norm_eps=norm_eps, ws_eps=ws_eps)
        self.stem = ResNetStem(in_channels, width, **kwargs)
        stages, channels = [], width
        for s, depth in enumerate(layers):
            stages.append(ResNetStage(channels, width * 2**s, depth, stride=1 if s == 0 else 2, **kwargs))
            channels = 4 * width * 2**s
        self.stages = nn.Sequential(*stages)
        self.out_channels = channels

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.stages(self.stem(x))


def build_resnet(layers: Sequence[int], in_channels: int = 3, width_factor: int = 1, num_groups: int = 32,
                 norm_eps: float = 1e-6, ws_eps: float = 1e-5) -> nn.Module:
    """The stem alone when ``layers`` is empty (R+Ti/16), else stem plus stages; both set ``out_channels``."""
    kwargs = dict(num_groups=num_groups, norm_eps=norm_eps, ws_eps=ws_eps)
    if len(layers) == 0:
        return ResNetStem(in_channels, 64 * width_factor, **kwargs)
    return ResNetV2Stages(layers, in_channels, width_factor, **kwargs)


def resnet_reduction(size: int, num_stages: int) -> int:
    """Output length of one spatial dimension after the stem and ``num_stages`` stages ('SAME' = ceil)."""
    size = math.ceil(math.ceil(size / 2) / 2)  # root conv /2, max-pool /2
    for _ in range(max(num_stages - 1, 0)):  # every stage but the first halves the size
        size = math.ceil(size / 2)
    return size
