"""One function per figure: from a loaded ViT (and images) to a PNG. The tools are thin CLIs over these."""
import math
from typing import Dict, List, Optional, Tuple

import numpy as np
import torch
import torch.nn as nn

from vit_plugin.evaluation import model_complexity
from vit_plugin.evaluation.figure_plots import (plot_attention_distance, plot_filter_components,
                                               plot_pos_embed_similarity, plot_rollout, plot_table)
from vit_plugin.evaluation.vit_maps import (attention_rollout, patch_embedding_components, pos_embed_similarity,
                                           rollout_to_map, stack_attention_distances)
from vit_plugin.models.vit_search import WrongModelError


def _grid_of(num_patches: int, image_hw: Tuple[int, int]) -> Tuple[int, int]:
    """The (rows, cols) patch grid of ``num_patches`` tokens covering an image of ``image_hw``."""
    rows = max(1, round(math.sqrt(num_patches * image_hw[0] / image_hw[1])))
    cols = num_patches // rows
    if rows * cols != num_patches:
        raise ValueError(f'cannot lay {num_patches} patch tokens out on the {image_hw[0]}x{image_hw[1]} image')
    return rows, cols


def filters_figure(vit: nn.Module, out: str, num_components: int = 28) -> str:
    """Top principal components of the patch-embedding filters as RGB tiles (Fig. 7 left)."""
    proj = getattr(getattr(vit, 'patch_embed', None), 'proj', None)
    if not isinstance(proj, nn.Conv2d) or proj.in_channels not in (1, 3):
        channels = getattr(proj, 'in_channels', None)
        raise WrongModelError(f'patch-embedding filters are drawn for models that embed image patches directly; '
                              f'this model\'s patch_embed.proj takes {channels} input channels (a hybrid ViT embeds '
                              f'ResNet features, whose 1x1 projection has no picture)')
    components, explained = patch_embedding_components(proj.weight, num_components)
    ph, pw = proj.kernel_size
    return plot_filter_components(components, explained, out,
                                  f'RGB embedding filters ({ph}x{pw}), top {len(components)} principal components')


def pos_embed_figure(vit: nn.Module, out: str) -> str:
    """Cosine similarity of each patch's position embedding to all others (Fig. 7 centre)."""
    grid = vit.patch_grid
    sim = pos_embed_similarity(vit.pos_embed, grid, vit.num_prefix_tokens)
    return plot_pos_embed_similarity(sim, out, f'Position embedding similarity ({grid[0]}x{grid[1]} patches)')


@torch.no_grad()
def attention_maps(vit: nn.Module, inputs: torch.Tensor, batch_size: int = 16):
    """Yield (attention maps of every layer, grid, pixels per patch) for batches of ``inputs``."""
    for start in range(0, len(inputs), batch_size):
        batch = inputs[start:start + batch_size]
        maps = vit.get_attention_maps(batch)
        grid = _grid_of(maps[0].shape[-1] - vit.num_prefix_tokens, tuple(batch.shape[-2:]))
        yield maps, grid, (batch.shape[-2] / grid[0], batch.shape[-1] / grid[1])


def attention_distances(vit: nn.Module, inputs: torch.Tensor, batch_size: int = 16) -> torch.Tensor:
    """Mean attention distance (pixels) per layer and head over all ``inputs``: (layers, heads)."""
    total, count = None, 0
    for maps, grid, patch_px in attention_maps(vit, inputs, batch_size):
        dist = stack_attention_distances(maps, grid, patch_px, vit.num_prefix_tokens) * len(maps[0])
        total = dist if total is None else total + dist
        count += len(maps[0])
    return total / count


def attention_distance_figure(vit: nn.Module, inputs: torch.Tensor, out: str) -> Tuple[str, torch.Tensor]:
    """Mean attention distance per head vs depth over ``inputs`` (Fig. 7 right); also returns the values."""
    dist = attention_distances(vit, inputs)
    size = tuple(inputs.shape[-2:])
    path = plot_attention_distance(dist, out, size, f'Mean attention distance over {len(inputs)} images '
                                   f'({size[0]}x{size[1]} px)')
    return path, dist


def rollout_maps(vit: nn.Module, inputs: torch.Tensor, residual: bool = True,
                 head_fusion: str = 'mean') -> torch.Tensor:
    """Attention rollout from the output token to the patches, (B, rows, cols)."""
    maps = []
    for layers, grid, _ in attention_maps(vit, inputs):
        maps.append(rollout_to_map(attention_rollout(layers, residual, head_fusion), grid, vit.num_prefix_tokens))
    return torch.cat(maps)


def rollout_figure(vit: nn.Module, inputs: torch.Tensor, display: np.ndarray, out: str, residual: bool = True,
                   head_fusion: str = 'mean', max_images: int = 8) -> str:
    """Images and their attention-rollout masks (Fig. 6); at most ``max_images``, evenly spaced in ``inputs``."""
    if len(inputs) > max_images:
        keep = np.unique(np.linspace(0, len(inputs) - 1, max_images).round().astype(int))
        inputs, display = inputs[torch.from_numpy(keep)], display[keep]
    maps = rollout_maps(vit, inputs, residual, head_fusion)
    return plot_rollout(display, maps, out, max_images=max_images)


SUMMARY_COLUMNS = dict(model='Model', resolution='Res.', layers='Layers', hidden='Hidden D', mlp='MLP', heads='Heads',
                       tokens='Tokens', params='Params', gflops='GFLOPs', paper_params='Table 1')


def summary_figure(out: str, rows: Optional[List[Dict]] = None) -> Tuple[str, List[Dict]]:
    """The model summary table (parameters, GFLOPs per arch/patch/resolution, paper's Table 1)."""
    rows = rows if rows is not None else model_complexity.summary_rows()
    path = plot_table(rows, SUMMARY_COLUMNS, out, 'ViT model sizes (1000 classes; FLOPs = multiply-adds)')
    return path, rows
