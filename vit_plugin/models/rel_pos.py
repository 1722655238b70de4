"""Decomposed relative position bias (MViTv2, ViTDet): ``q . Rh[i - k] + q . Rw[j - l]`` (docs/detection.md)."""
from typing import Tuple

import torch
import torch.nn.functional as F

#: Name endings of the tables inside a ViT (``blocks.i.attn.rel_pos_h``), for loaders and optimisers.
REL_POS_PARAM_SUFFIXES = ('attn.rel_pos_h', 'attn.rel_pos_w')


def resize_rel_pos_table(table: torch.Tensor, length: int) -> torch.Tensor:
    """A (L, C) table (entry ``L // 2 + o`` for offset ``o``) resampled linearly to ``length`` offsets."""
    if table.shape[0] == length:
        return table
    resized = F.interpolate(table.t()[None].float(), size=length, mode='linear', align_corners=False)
    return resized[0].t().to(table.dtype)


def rel_pos_embeddings(table: torch.Tensor, size: int, span: int = 0) -> torch.Tensor:
    """(size, size, C) embeddings ``E[a, b] = table[a - b]``; offsets beyond ``span`` (0: ``size``) clamped."""
    span = span or size
    table = resize_rel_pos_table(table, 2 * span - 1)
    pos = torch.arange(size, device=table.device)
    offsets = (pos[:, None] - pos[None, :]).clamp(-(span - 1), span - 1)
    return table[offsets + span - 1]


def decomposed_rel_pos_bias(q: torch.Tensor, table_h: torch.Tensor, table_w: torch.Tensor,
                            grid: Tuple[int, int], span: Tuple[int, int] = (0, 0)) -> torch.Tensor:
    """(..., rows * cols, rows * cols) bias of patch queries ``q`` (unscaled) over keys of the same ``grid``."""
    rows, cols = grid
    emb_h = rel_pos_embeddings(table_h, rows, span[0]).to(q.dtype)  # (rows, rows, C)
    emb_w = rel_pos_embeddings(table_w, cols, span[1]).to(q.dtype)  # (cols, cols, C)
    q = q.unflatten(-2, (rows, cols))
    bias_h = torch.einsum('...ijc,ikc->...ijk', q, emb_h)  # query (i, j), key row k
    bias_w = torch.einsum('...ijc,jlc->...ijl', q, emb_w)  # query (i, j), key column l
    bias = bias_h.unsqueeze(-1) + bias_w.unsqueeze(-2)  # (..., rows, cols, rows, cols)
    return bias.flatten(-2).flatten(-3, -2)


def pad_prefix_bias(bias: torch.Tensor, num_prefix_queries: int, num_prefix_keys: int) -> torch.Tensor:
    """Zero bias rows/columns for class/prefix tokens placed before the patches."""
    if not (num_prefix_queries or num_prefix_keys):
        return bias
    return F.pad(bias, (num_prefix_keys, 0, num_prefix_queries, 0))
