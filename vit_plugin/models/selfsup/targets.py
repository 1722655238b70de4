"""Prediction targets of masked patch prediction from un-normalised pixels, patches row-major (docs/mpp.md)."""
from typing import Optional, Tuple

import torch
import torch.nn.functional as F

from vit_plugin.compat import mmengine as mmengine_compat

TARGETS = ('mean_color_3bit', 'downsized_4x4_3bit', 'pixel_l2')
#: The largest value of an 8-bit image channel: targets assume pixels in [0, PIXEL_MAX].
PIXEL_MAX = 255.
#: See :func:`quantize`.
EDGE_TOLERANCE = 2e-4


def unnormalize(inputs: torch.Tensor, data_preprocessor: Optional[torch.nn.Module]) -> torch.Tensor:
    """Undo the preprocessor's ``(x - mean) / std`` (None: unchanged) -> pixels (B, C, H, W) in [0, 255]."""
    if data_preprocessor is not None and mmengine_compat.normalizes(data_preprocessor):
        mean = data_preprocessor.mean.to(inputs.dtype)
        std = data_preprocessor.std.to(inputs.dtype)
        if mean.numel() not in (1, inputs.shape[1]):
            raise ValueError(f'the data preprocessor normalises {mean.numel()} channels but the inputs have '
                             f'{inputs.shape[1]}; give it one mean/std per input channel')
        inputs = inputs * std + mean
    return inputs.clamp(0., PIXEL_MAX)


def _check_divisible(size: Tuple[int, int], cell: Tuple[int, int], what: str):
    if size[0] % cell[0] or size[1] % cell[1]:
        raise ValueError(f'{what}: {size[0]}x{size[1]} is not divisible by {cell[0]}x{cell[1]}; use an input '
                         f'size that is a multiple of the patch size (the MPP targets are defined per patch)')


def quantize(values: torch.Tensor, bits: int = 3) -> torch.Tensor:
    """Values in [0, 255] -> levels in [0, 2**bits) of equal bins; ``EDGE_TOLERANCE`` below an edge is on it."""
    levels = 2**bits
    values = values.clamp(0., PIXEL_MAX) + EDGE_TOLERANCE
    return torch.div(values * levels, PIXEL_MAX + 1, rounding_mode='floor').long().clamp(0, levels - 1)


def color_to_class(levels: torch.Tensor, bits: int = 3) -> torch.Tensor:
    """Quantised colours (..., C) -> one class index, channel 0 most significant (R*64 + G*8 + B)."""
    index = torch.zeros_like(levels[..., 0])
    for c in range(levels.shape[-1]):
        index = index * 2**bits + levels[..., c]
    return index


def class_to_color(index: torch.Tensor, bits: int = 3, channels: int = 3) -> torch.Tensor:
    """Inverse of :func:`color_to_class`: class indices -> colours (..., C) at the centre of each bin."""
    levels = []
    for _ in range(channels):
        levels.append(index % 2**bits)
        index = torch.div(index, 2**bits, rounding_mode='floor')
    levels = torch.stack(levels[::-1], dim=-1).float()
    return (levels + 0.5) * (PIXEL_MAX + 1) / 2**bits


def _cells(pixels: torch.Tensor, patch_size: Tuple[int, int], cells: int) -> torch.Tensor:
    """Average each patch down to ``cells x cells`` -> (B, N, cells*cells, C), cells row-major."""
    B, C, H, W = pixels.shape
    ph, pw = patch_size
    _check_divisible((H, W), (ph, pw), 'input size vs patch size')
    _check_divisible((ph, pw), (cells, cells), f'patch size vs the {cells}x{cells} target grid')
    pooled = F.avg_pool2d(pixels, kernel_size=(ph // cells, pw // cells))  # (B, C, h*cells, w*cells)
    h, w = H // ph, W // pw
    pooled = pooled.reshape(B, C, h, cells, w, cells).permute(0, 2, 4, 3, 5, 1)
    return pooled.reshape(B, h * w, cells * cells, C)


def mean_color_target(pixels: torch.Tensor, patch_size: Tuple[int, int], bits: int = 3) -> torch.Tensor:
    """Class (B, N) of each patch's mean colour (of whole 8-bit levels), ``2**(bits*C)`` classes."""
    return color_to_class(quantize(_cells(torch.round(pixels), patch_size, 1)[:, :, 0], bits), bits)


def downsized_target(pixels: torch.Tensor, patch_size: Tuple[int, int], cells: int = 4,
                     bits: int = 3) -> torch.Tensor:
    """Classes (B, N, cells*cells) of the colours of each patch averaged down to ``cells x cells``."""
    return color_to_class(quantize(_cells(torch.round(pixels), patch_size, cells), bits), bits)


def pixel_target(pixels: torch.Tensor, patch_size: Tuple[int, int]) -> torch.Tensor:
    """Every pixel of each patch, (B, N, ph*pw*C) ordered (row, column, channel), in [-1, 1]."""
    B, C, H, W = pixels.shape
    ph, pw = patch_size
    _check_divisible((H, W), (ph, pw), 'input size vs patch size')
    h, w = H // ph, W // pw
    patches = pixels.reshape(B, C, h, ph, w, pw).permute(0, 2, 4, 3, 5, 1).reshape(B, h * w, ph * pw * C)
    return patches / (PIXEL_MAX / 2) - 1.


def pixels_from_pixel_target(target: torch.Tensor, patch_size: Tuple[int, int], channels: int = 3) -> torch.Tensor:
    """Inverse of :func:`pixel_target` for one patch or many: (..., ph*pw*C) -> (..., ph, pw, C) in [0, 255]."""
    ph, pw = patch_size
    return ((target + 1.) * (PIXEL_MAX / 2)).clamp(0., PIXEL_MAX).reshape(*target.shape[:-1], ph, pw, channels)


def compute_targets(kind: str, pixels: torch.Tensor, patch_size: Tuple[int, int], bits: int = 3,
                    cells: int = 4) -> torch.Tensor:
    """Targets of every patch for ``kind`` (:data:`TARGETS`) from pixels (B, C, H, W) in [0, 255].

    Returns (B, N) long, (B, N, cells**2) long, or (B, N, ph*pw*C) float."""
    if kind == 'mean_color_3bit':
        return mean_color_target(pixels, patch_size, bits)
    if kind == 'downsized_4x4_3bit':
        return downsized_target(pixels, patch_size, cells, bits)
    if kind == 'pixel_l2':
        return pixel_target(pixels, patch_size)
    raise ValueError(f'unknown MPP target {kind!r}; choose one of {TARGETS}')
