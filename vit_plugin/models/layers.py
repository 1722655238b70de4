"""Building blocks of the ViT encoder; parameter names follow timm's. See docs/backbone.md."""
from typing import Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F
from mmcv.cnn.bricks import DropPath
from torch.utils.checkpoint import checkpoint

from .rel_pos import decomposed_rel_pos_bias, pad_prefix_bias


def lecun_normal_(tensor: torch.Tensor) -> torch.Tensor:
    """Flax's default kernel init: normal truncated at two std, variance 1 / fan_in (``tensor[0].numel()``)."""
    std = (1. / tensor[0].numel())**0.5 / .87962566103423978  # std of a unit normal truncated at +-2
    return nn.init.trunc_normal_(tensor, std=std, a=-2 * std, b=2 * std)


def pad_to_patch_multiple(x: torch.Tensor, patch_size: Tuple[int, int], mode: str = 'corner') -> torch.Tensor:
    """Zero-pad (..., H, W) to multiples of ``patch_size``; ``mode`` 'corner' (bottom/right) or 'same' (split).

    Raises:
        ValueError: An unknown ``mode``.
    """
    pad_h, pad_w = (-x.shape[-2]) % patch_size[0], (-x.shape[-1]) % patch_size[1]
    if not (pad_h or pad_w):
        return x
    if mode == 'corner':
        return F.pad(x, (0, pad_w, 0, pad_h))
    if mode == 'same':
        return F.pad(x, (pad_w // 2, pad_w - pad_w // 2, pad_h // 2, pad_h - pad_h // 2))
    raise ValueError(f"padding mode must be 'corner' or 'same', got {mode!r}")


class PatchEmbed(nn.Module):
    """Non-overlapping patches projected by one conv: (B, C, H, W) -> (B, h*w, ``embed_dims``), (h, w)."""

    def __init__(self, patch_size: Tuple[int, int], in_channels: int = 3, embed_dims: int = 768, bias: bool = True):
        super().__init__()
        self.patch_size = tuple(patch_size)
        self.proj = nn.Conv2d(in_channels, embed_dims, kernel_size=self.patch_size, stride=self.patch_size,
                              bias=bias)

    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, Tuple[int, int]]:
        """(B, C, H, W) -> tokens (B, h*w, D) and the patch grid (h, w)."""
        x = self.proj(x)
        grid = (x.shape[2], x.shape[3])
        return x.flatten(2).transpose(1, 2), grid


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: Optional[torch.Tensor] = None,
           dropout_p: float = 0., return_weights: bool = False) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """``softmax(q k^T / sqrt(d) + bias) v`` -> (output, weights if ``return_weights`` else None).

    ``bias``: additive float, or bool mask (True = allowed), broadcastable to (..., N, M)."""
    if not return_weights:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=dropout_p), None
    logits = (q * q.shape[-1]**-0.5) @ k.transpose(-2, -1)
    if bias is not None:
        logits = logits.masked_fill(~bias, float('-inf')) if bias.dtype == torch.bool else logits + bias
    weights = logits.softmax(dim=-1)
    return F.dropout(weights, dropout_p) @ v, weights


def split_heads(qkv: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(B, N, 3, heads, d) -> q, k, v of (B, heads, N, d), as views."""
    return qkv.permute(2, 0, 3, 1, 4).unbind(0)


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    """(B, heads, N, d) -> (B, N, heads * d)."""
    B, heads, N, d = x.shape
    return x.transpose(1, 2).reshape(B, N, heads * d)


class Attention(nn.Module):
    """Multi-head self-attention with one fused qkv projection, global or windowed.

    ``rel_pos_size`` (rows, cols) adds zero-initialised relative position tables (:mod:`.rel_pos`)."""

    def __init__(self, embed_dims: int, num_heads: int, qkv_bias: bool = True, attn_drop: float = 0.,
                 proj_drop: float = 0., rel_pos_size: Optional[Tuple[int, int]] = None):
        super().__init__()
        if embed_dims % num_heads:
            raise ValueError(f'embed_dims ({embed_dims}) must be divisible by num_heads ({num_heads})')
        self.num_heads = num_heads
        self.head_dims = embed_dims // num_heads
        self.attn_drop = attn_drop
        self.qkv = nn.Linear(embed_dims, embed_dims * 3, bias=qkv_bias)
        self.proj = nn.Linear(embed_dims, embed_dims)
        self.proj_drop = nn.Dropout(proj_drop)
        self.use_rel_pos = rel_pos_size is not None
        if self.use_rel_pos:
            self.rel_pos_h = nn.Parameter(torch.zeros(2 * rel_pos_size[0] - 1, self.head_dims))
            self.rel_pos_w = nn.Parameter(torch.zeros(2 * rel_pos_size[1] - 1, self.head_dims))

    @property
    def dropout_p(self) -> float:
        return self.attn_drop if self.training else 0.

    def qkv_tokens(self, x: torch.Tensor) -> torch.Tensor:
        """Tokens (B, N, C) -> their queries, keys and values, (B, N, 3, heads, head_dims)."""
        B, N, _ = x.shape
        return self.qkv(x).reshape(B, N, 3, self.num_heads, self.head_dims)

    def rel_pos_bias(self, q: torch.Tensor, grid: Optional[Tuple[int, int]], span: int = 0) -> Optional[torch.Tensor]:
        """Relative position bias (..., N, N) for ``q``, or None without tables; zero for prefix tokens.

        Raises:
            ValueError: ``grid`` is None although the tables need it.
        """
        if not self.use_rel_pos:
            return None
        if grid is None:
            raise ValueError('attention with relative position bias needs the patch grid: pass grid=(rows, cols)')
        prefix = q.shape[-2] - grid[0] * grid[1]
        bias = decomposed_rel_pos_bias(q[..., prefix:, :], self.rel_pos_h, self.rel_pos_w, grid, (span, span))
        return pad_prefix_bias(bias, prefix, prefix)

    def forward(self, x: torch.Tensor, return_attention: bool = False, grid: Optional[Tuple[int, int]] = None,
                window_size: int = 0, num_prefix_tokens: int = 1):
        """(B, N, C) -> (B, N, C), and the (B, heads, N, N) weights with ``return_attention``.

        ``grid`` is needed with windows (``window_size`` > 0) or relative position bias."""
        if window_size and grid is None:
            raise ValueError('a windowed-attention block needs the patch grid: call block(x, grid=(rows, cols))')
        if window_size and not return_attention:
            return windowed_attention(self, x, grid, window_size, num_prefix_tokens)
        q, k, v = split_heads(self.qkv_tokens(x))
        # In a windowed block the tables cover the offsets within a window; other pairs are masked.
        bias = self.rel_pos_bias(q, grid, span=window_size)
        if window_size:  # the windowed attention as one dense masked attention (analysis maps)
            allowed = window_attention_mask(grid, window_size, num_prefix_tokens, x.device)
            bias = allowed if bias is None else bias.masked_fill(~allowed, float('-inf'))
        out, weights = attend(q, k, v, bias, self.dropout_p, return_weights=return_attention)
        out = self.proj_drop(self.proj(merge_heads(out)))
        return (out, weights) if return_attention else out


def window_attention_mask(grid: Tuple[int, int], window_size: int, num_prefix_tokens: int = 1,
                          device: Optional[torch.device] = None) -> torch.Tensor:
    """(N, N) bool mask of windowed attention (True = allowed): patches see the prefix and their window."""
    rows = torch.arange(grid[0], device=device) // window_size
    cols = torch.arange(grid[1], device=device) // window_size
    window_id = (rows[:, None] * grid[1] + cols[None, :]).flatten()
    patch_mask = window_id[:, None] == window_id[None, :]
    n = num_prefix_tokens + patch_mask.shape[0]
    mask = torch.ones(n, n, dtype=torch.bool, device=device)
    mask[num_prefix_tokens:, num_prefix_tokens:] = patch_mask
    return mask


def windowed_attention(attn: Attention, x: torch.Tensor, grid: Tuple[int, int], window_size: int,
                       num_prefix_tokens: int = 1) -> torch.Tensor:
    """Attention within windows of the patch grid, padding masked, prefix global (docs/detection.md).

    Returns (B, N, C) after the output projection.

    Raises:
        ValueError: N does not match the grid and the prefix.
    """
    B, N, C = x.shape
    rows, cols = grid
    if N != num_prefix_tokens + rows * cols:
        raise ValueError(f'windowed attention got {N} tokens for a {rows}x{cols} grid with '
                         f'{num_prefix_tokens} prefix tokens')
    heads, dims, ws = attn.num_heads, attn.head_dims, window_size
    drop = attn.dropout_p
    qkv = attn.qkv_tokens(x)
    prefix, patches = qkv[:, :num_prefix_tokens], qkv[:, num_prefix_tokens:]

    pad_r, pad_c = (-rows) % ws, (-cols) % ws
    patches = patches.reshape(B, rows, cols, 3 * heads * dims)
    if pad_r or pad_c:
        patches = F.pad(patches, (0, 0, 0, pad_c, 0, pad_r))
    nr, nc = (rows + pad_r) // ws, (cols + pad_c) // ws
    # (B, nr, ws, nc, ws, 3, h, d) -> (3, B * windows, h, ws * ws, d)
    win = patches.reshape(B, nr, ws, nc, ws, 3, heads, dims).permute(5, 0, 1, 3, 6, 2, 4, 7)
    q, k, v = win.reshape(3, B * nr * nc, heads, ws * ws, dims).unbind(0)
    if num_prefix_tokens:
        pq, pk, pv = split_heads(prefix)  # (B, h, P, d) each
        k = torch.cat([pk.repeat_interleave(nr * nc, dim=0), k], dim=2)
        v = torch.cat([pv.repeat_interleave(nr * nc, dim=0), v], dim=2)
    mask = None
    if pad_r or pad_c:
        valid = torch.zeros(rows + pad_r, cols + pad_c, dtype=torch.bool, device=x.device)
        valid[:rows, :cols] = True
        valid = valid.reshape(nr, ws, nc, ws).permute(0, 2, 1, 3).reshape(nr * nc, ws * ws)
        valid = torch.cat([valid.new_ones(nr * nc, num_prefix_tokens), valid], dim=1)
        mask = valid.repeat(B, 1)[:, None, None, :]  # (B * windows, 1, 1, keys)
    if attn.use_rel_pos:  # offsets within the window; none for the prefix keys
        bias = decomposed_rel_pos_bias(q, attn.rel_pos_h, attn.rel_pos_w, (ws, ws))
        bias = pad_prefix_bias(bias, 0, num_prefix_tokens)
        mask = bias if mask is None else bias.masked_fill(~mask, float('-inf'))
    out, _ = attend(q, k, v, mask, drop)
    # (B * windows, h, ws * ws, d) -> (B, rows, cols, C)
    out = out.reshape(B, nr, nc, heads, ws, ws, dims).permute(0, 1, 4, 2, 5, 3, 6)
    out = out.reshape(B, nr * ws, nc * ws, C)[:, :rows, :cols].reshape(B, rows * cols, C)
    if num_prefix_tokens:  # prefix queries attend globally
        _, k_all, v_all = split_heads(qkv)
        prefix_out, _ = attend(pq, k_all, v_all, dropout_p=drop)
        out = torch.cat([merge_heads(prefix_out), out], dim=1)
    return attn.proj_drop(attn.proj(out))


class QuickGELU(nn.Module):
    """``x * sigmoid(1.702 x)``, CLIP's GELU."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(1.702 * x)


#: MLP activations by name: 'gelu' (exact or tanh, see :class:`Mlp`) and CLIP's 'quick_gelu'.
ACTIVATIONS = ('gelu', 'quick_gelu')


class Mlp(nn.Module):
    """fc1 -> GELU (``gelu_approximate`` 'none'/'tanh') or 'quick_gelu' ``activation`` -> fc2, dropout ``drop``."""

    def __init__(self, embed_dims: int, hidden_dims: int, gelu_approximate: str = 'none', drop: float = 0.,
                 activation: str = 'gelu'):
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(f'activation must be one of {ACTIVATIONS}, got {activation!r}')
        self.fc1 = nn.Linear(embed_dims, hidden_dims)
        self.act = nn.GELU(approximate=gelu_approximate) if activation == 'gelu' else QuickGELU()
        self.drop1 = nn.Dropout(drop)
        self.fc2 = nn.Linear(hidden_dims, embed_dims)
        self.drop2 = nn.Dropout(drop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop2(self.fc2(self.drop1(self.act(self.fc1(x)))))


def swiglu_hidden_dims(mlp_dims: int) -> int:
    """Half-width of a SwiGLU MLP replacing a GELU MLP of ``mlp_dims``: 2/3, rounded up to 8."""
    return (int(mlp_dims * 2 / 3) + 7) // 8 * 8


class SwiGLUMlp(nn.Module):
    """SwiGLU MLP ``fc2(silu(a) * b)`` over the halves of one packed ``fc1``, named as timm's ``SwiGLUPacked``."""

    def __init__(self, embed_dims: int, hidden_dims: int, drop: float = 0.):
        super().__init__()
        self.fc1 = nn.Linear(embed_dims, 2 * hidden_dims)
        self.drop1 = nn.Dropout(drop)
        self.fc2 = nn.Linear(hidden_dims, embed_dims)
        self.drop2 = nn.Dropout(drop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, value = self.fc1(x).chunk(2, dim=-1)
        return self.drop2(self.fc2(self.drop1(F.silu(gate) * value)))


class LayerScale(nn.Module):
    """Learned per-channel scale ``x * gamma`` of a residual branch, ``gamma`` starting at ``init_value``."""

    def __init__(self, embed_dims: int, init_value: float):
        super().__init__()
        self.gamma = nn.Parameter(torch.full((embed_dims, ), float(init_value)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.gamma


class EncoderBlock(nn.Module):
    """Pre-norm block: ``x + ls1 * MSA(LN(x))``, then ``x + ls2 * MLP(LN(x))``.

    Keywords as :class:`Attention` and :class:`Mlp`; ``ffn_type`` 'origin' or 'swiglu_fused'
    (:class:`SwiGLUMlp`); ``layer_scale_init_value`` > 0 adds :class:`LayerScale`.

    Raises:
        ValueError: A negative ``window_size`` or an unknown ``ffn_type``.
    """

    def __init__(self, embed_dims: int, num_heads: int, mlp_dims: int, qkv_bias: bool = True, drop: float = 0.,
                 attn_drop: float = 0., drop_path: float = 0., norm_eps: float = 1e-6,
                 gelu_approximate: str = 'none', window_size: int = 0, num_prefix_tokens: int = 1,
                 rel_pos_grid: Optional[Tuple[int, int]] = None, layer_scale_init_value: float = 0.,
                 ffn_type: str = 'origin', activation: str = 'gelu'):
        super().__init__()
        if window_size < 0:
            raise ValueError(f'window_size must be >= 0 (0 = global attention), got {window_size}')
        self.window_size = window_size
        self.num_prefix_tokens = num_prefix_tokens
        self.norm1 = nn.LayerNorm(embed_dims, eps=norm_eps)
        if rel_pos_grid is not None and window_size:
            rel_pos_grid = (window_size, window_size)
        self.attn = Attention(embed_dims, num_heads, qkv_bias=qkv_bias, attn_drop=attn_drop, proj_drop=drop,
                              rel_pos_size=rel_pos_grid)
        self.ls1 = LayerScale(embed_dims, layer_scale_init_value) if layer_scale_init_value > 0 else nn.Identity()
        self.norm2 = nn.LayerNorm(embed_dims, eps=norm_eps)
        if ffn_type == 'origin':
            self.mlp = Mlp(embed_dims, mlp_dims, gelu_approximate=gelu_approximate, drop=drop, activation=activation)
        elif ffn_type == 'swiglu_fused':
            self.mlp = SwiGLUMlp(embed_dims, swiglu_hidden_dims(mlp_dims), drop=drop)
        else:
            raise ValueError(f"ffn_type must be 'origin' (GELU MLP) or 'swiglu_fused' (SwiGLU), got {ffn_type!r}")
        self.ls2 = LayerScale(embed_dims, layer_scale_init_value) if layer_scale_init_value > 0 else nn.Identity()
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()
        self.with_cp = False

    def _forward(self, x: torch.Tensor, grid: Optional[Tuple[int, int]] = None, return_attention: bool = False):
        out = self.attn(self.norm1(x), return_attention, grid, self.window_size, self.num_prefix_tokens)
        y, weights = out if return_attention else (out, None)
        x = x + self.drop_path(self.ls1(y))
        x = x + self.drop_path(self.ls2(self.mlp(self.norm2(x))))
        return (x, weights) if return_attention else x

    def forward(self, x: torch.Tensor, return_attention: bool = False, grid: Optional[Tuple[int, int]] = None):
        """Tokens (B, N, D) -> (B, N, D), and the weights with ``return_attention``; ``grid`` as :class:`Attention`."""
        if self.with_cp and self.training and x.requires_grad and not return_attention:
            # Activation checkpointing: keep only the block input, recompute the rest in backward.
            return checkpoint(self._forward, x, grid, use_reentrant=False)
        return self._forward(x, grid, return_attention)

    def extra_repr(self) -> str:
        return f'window_size={self.window_size}' if self.window_size else ''
