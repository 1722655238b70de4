"""Resizing 1D position embeddings as their 2D grid (docs/checkpoints.md#position-embedding-resize)."""
import math
from typing import Optional, Sequence, Tuple, Union

import torch
import torch.nn.functional as F

Grid = Tuple[int, int]

#: Resize modes. ``'official'`` reproduces the official JAX loader, which resizes with
#: ``scipy.ndimage.zoom(order=1)``: linear interpolation whose first and last samples sit exactly on
#: the first and last old positions, i.e. PyTorch's ``align_corners=True``. The others follow the
#: timm/mmpretrain convention of half-pixel centres (``align_corners=False``).
RESIZE_MODES = ('official', 'bilinear', 'bicubic')

#: How a checkpoint that records no resize mode of its own (ours, timm's, mmpretrain's) is resized
#: when it loads at another grid: the ViT's ``pos_embed_load_mode`` default and the converters'
#: fallback. 'official' because it is the resize behind every fine-tuning result of the paper (the
#: official code applies it to all pre-trained weights), because the official weights record it, so
#: our own and official weights then enter fine-tuning identically, and so that supervised and
#: self-supervised (MPP) fine-tuning differ only in the pre-trained weights.
CHECKPOINT_RESIZE_MODE = 'official'


def to_2tuple(value: Union[int, Sequence[int]]) -> Grid:
    """``7 -> (7, 7)``; ``(7, 9) -> (7, 9)``."""
    if isinstance(value, int):
        return (value, value)
    value = tuple(int(v) for v in value)
    if len(value) != 2:
        raise ValueError(f'expected an int or a pair of ints, got {value!r}')
    return value


def infer_grid(num_patches: int, grid: Optional[Sequence[int]] = None, what: str = 'pos_embed') -> Grid:
    """The (rows, cols) grid of ``num_patches`` entries: ``grid`` checked, or a square one.

    Raises:
        ValueError: ``grid`` does not match, or none was given and ``num_patches`` is not square.
    """
    if grid is not None:
        grid = to_2tuple(grid)
        if grid[0] * grid[1] != num_patches:
            raise ValueError(f'{what}: a grid of {grid[0]}x{grid[1]} needs {grid[0] * grid[1]} patch '
                             f'entries, but the table has {num_patches}. Pass the grid the weights '
                             f'were trained with.')
        return grid
    side = math.isqrt(num_patches)
    if side * side != num_patches:
        raise ValueError(
            f'{what}: cannot infer the patch grid of {num_patches} patch entries: not square, and no grid '
            f'metadata. Pass `old_grid=(rows, cols)` (a pre-hook/converter: `pos_embed_grid=(rows, cols)`) '
            f'with rows*cols == {num_patches}.')
    return (side, side)


def resize_pos_embed(pos_embed: torch.Tensor,
                     new_grid: Union[int, Sequence[int]],
                     old_grid: Optional[Sequence[int]] = None,
                     num_prefix_tokens: int = 1,
                     mode: str = 'bicubic',
                     antialias: bool = False,
                     compute_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Resize ``pos_embed`` ((1,) P + rows*cols, D) to ``new_grid``, keeping the P prefix entries.

    ``mode`` one of :data:`RESIZE_MODES`; ``compute_dtype`` the least precision (loading uses float64).
    Returns the same dtype, device and rank."""
    if mode not in RESIZE_MODES:
        raise ValueError(f'unknown position-embedding resize mode {mode!r}; choose one of {RESIZE_MODES}')
    if antialias and mode == 'official':
        raise ValueError("antialias is not part of the official resize; use mode='bilinear' or "
                         "'bicubic' with antialias=True")
    squeeze = pos_embed.dim() == 2
    if squeeze:
        pos_embed = pos_embed.unsqueeze(0)
    if pos_embed.dim() != 3:
        raise ValueError(f'pos_embed must have shape (1, N, D) or (N, D), got {tuple(pos_embed.shape)}')
    new_grid = to_2tuple(new_grid)
    prefix, patches = pos_embed[:, :num_prefix_tokens], pos_embed[:, num_prefix_tokens:]
    old_grid = infer_grid(patches.shape[1], old_grid)
    if old_grid != new_grid:
        dim = patches.shape[-1]
        grid = patches.to(torch.promote_types(patches.dtype, compute_dtype))
        grid = grid.reshape(patches.shape[0], old_grid[0], old_grid[1], dim).permute(0, 3, 1, 2)
        if mode == 'official':
            grid = F.interpolate(grid, size=new_grid, mode='bilinear', align_corners=True)
        else:
            # mmpretrain's resize_pos_embed computes this case bit-identically for float32 work without
            # antialias, but it always interpolates in float32 (the loading paths here use float64;
            # the two then differ by up to ~7e-6 on unit-scale tables) and has no antialias: kept here.
            grid = F.interpolate(grid, size=new_grid, mode=mode, align_corners=False, antialias=antialias)
        patches = grid.permute(0, 2, 3, 1).reshape(patches.shape[0], new_grid[0] * new_grid[1], dim)
        pos_embed = torch.cat([prefix, patches.to(prefix.dtype)], dim=1)
    return pos_embed.squeeze(0) if squeeze else pos_embed
