"""The quantities behind the paper's Figures 6 and 7 (docs/evaluation.md#figures)."""
from typing import List, Sequence, Tuple

import torch


def patch_embedding_components(weight: torch.Tensor, num_components: int = 28) -> Tuple[torch.Tensor, torch.Tensor]:
    """Top principal components (k, C, ph, pw) of the centred patch filters, unit norm, and their variance
    fractions (k,)."""
    if weight.dim() != 4:
        raise ValueError(f'expected a convolution kernel (D, C, ph, pw), got shape {tuple(weight.shape)}')
    filters = weight.detach().double().flatten(1)
    filters = filters - filters.mean(0, keepdim=True)
    _, s, vh = torch.linalg.svd(filters, full_matrices=False)
    k = min(num_components, vh.shape[0])
    variance = s**2
    explained = variance / variance.sum().clamp_min(1e-300)
    return vh[:k].reshape(k, *weight.shape[1:]).float(), explained[:k].float()


def pos_embed_similarity(pos_embed: torch.Tensor, grid: Sequence[int], num_prefix_tokens: int = 1) -> torch.Tensor:
    """Cosine similarity (rows, cols, rows, cols) of each position's embedding to every other (prefix skipped)."""
    table = pos_embed.detach().float().reshape(-1, pos_embed.shape[-1])[num_prefix_tokens:]
    rows, cols = int(grid[0]), int(grid[1])
    if table.shape[0] != rows * cols:
        raise ValueError(f'the position embedding has {table.shape[0]} patch entries, but a {rows}x{cols} grid '
                         f'needs {rows * cols}; check num_prefix_tokens and the grid')
    unit = torch.nn.functional.normalize(table, dim=1)
    return (unit @ unit.T).reshape(rows, cols, rows, cols)


def patch_distances(grid: Sequence[int], patch_px: Sequence[float]) -> torch.Tensor:
    """Euclidean distance in pixels between the centres of every pair of patches, (P, P)."""
    rows, cols = int(grid[0]), int(grid[1])
    ys, xs = torch.meshgrid(torch.arange(rows, dtype=torch.float64) * float(patch_px[0]),
                            torch.arange(cols, dtype=torch.float64) * float(patch_px[1]), indexing='ij')
    centres = torch.stack([ys.flatten(), xs.flatten()], dim=1)
    return torch.cdist(centres, centres)


def mean_attention_distance(attn: torch.Tensor, grid: Sequence[int], patch_px: Sequence[float],
                            num_prefix_tokens: int = 1) -> torch.Tensor:
    """(B, heads) float64 attention-weighted query-key distance in pixels, over patch tokens only."""
    p = num_prefix_tokens
    rows, cols = int(grid[0]), int(grid[1])
    if attn.dim() != 4 or attn.shape[-1] != attn.shape[-2] or attn.shape[-1] != p + rows * cols:
        raise ValueError(f'expected attention (B, heads, N, N) with N = {p} + {rows}*{cols}, got {tuple(attn.shape)}')
    weights = attn.detach().double()[:, :, p:, p:]
    weights = weights / weights.sum(-1, keepdim=True).clamp_min(1e-12)
    dist = patch_distances(grid, patch_px).to(weights.device)
    return (weights * dist).sum(-1).mean(-1)


def attention_rollout(attentions: Sequence[torch.Tensor], residual: bool = True,
                      head_fusion: str = 'mean') -> torch.Tensor:
    """Attention rollout (Abnar & Zuidema): (B, N, N) ``R = A_L ... A_1`` of head-fused, residual-mixed maps."""
    if not attentions:
        raise ValueError('attention rollout needs the attention maps of at least one layer')
    fuse = {'mean': lambda a: a.mean(1), 'max': lambda a: a.amax(1), 'min': lambda a: a.amin(1)}
    if head_fusion not in fuse:
        raise ValueError(f"head_fusion must be one of {sorted(fuse)}, got {head_fusion!r}")
    rollout = None
    for attn in attentions:
        a = fuse[head_fusion](attn.detach().double())
        if residual:
            a = 0.5 * a + 0.5 * torch.eye(a.shape[-1], dtype=a.dtype, device=a.device)
        a = a / a.sum(-1, keepdim=True).clamp_min(1e-12)
        rollout = a if rollout is None else a @ rollout
    return rollout


def rollout_to_map(rollout: torch.Tensor, grid: Sequence[int], num_prefix_tokens: int = 1) -> torch.Tensor:
    """The output token's rollout over the patches as (B, rows, cols); without class token the patch mean's."""
    p = num_prefix_tokens
    rows = rollout[:, 0, p:] if p > 0 else rollout[:, p:, p:].mean(1)
    return rows.reshape(rollout.shape[0], int(grid[0]), int(grid[1]))


def stack_attention_distances(attentions: List[torch.Tensor], grid, patch_px,
                              num_prefix_tokens: int = 1) -> torch.Tensor:
    """Mean attention distance per layer and head, averaged over the batch: (layers, heads)."""
    return torch.stack([mean_attention_distance(a, grid, patch_px, num_prefix_tokens).mean(0) for a in attentions])
