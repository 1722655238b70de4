"""Building blocks of the ViT encoder: patch embedding, attention, MLPs, layer scale and the pre-norm block.

Parameter names follow timm's (``patch_embed.proj``, ``blocks.N.attn.qkv`` ...) so that converting to
and from timm is a renaming-free copy and third-party tooling that knows timm's layout works on ours.
"""
from typing import Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F
from mmcv.cnn.bricks import DropPath
from torch.utils.checkpoint import checkpoint

from .rel_pos import decomposed_rel_pos_bias, pad_prefix_bias


def lecun_normal_(tensor: torch.Tensor) -> torch.Tensor:
    """Flax's default kernel init: a normal truncated at two std, rescaled to variance 1 / fan_in.

    ``fan_in`` is ``tensor[0].numel()`` (PyTorch's (out, in, ...) layout). The truncation bounds are
    relative to the std, as in ``jax.nn.initializers.lecun_normal``.
    """
    std = (1. / tensor[0].numel())**0.5 / .87962566103423978  # std of a unit normal truncated at +-2
    return nn.init.trunc_normal_(tensor, std=std, a=-2 * std, b=2 * std)


def pad_to_patch_multiple(x: torch.Tensor, patch_size: Tuple[int, int], mode: str = 'corner') -> torch.Tensor:
    """Zero-pad images (..., H, W) up to the next multiple of the patch size (mmcv's adaptive padding).

    Args:
        x (Tensor): Images or feature maps (..., H, W).
        patch_size (tuple[int, int]): Patch height and width.
        mode (str): 'corner' pads the bottom and right; 'same' splits the padding between both sides,
            the odd pixel at the bottom/right. Defaults to 'corner'.
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
    """Split an image into non-overlapping patches and project each one linearly.

    One convolution with kernel = stride = patch size and no padding ('VALID'), as in the paper.

    Args:
        patch_size (tuple[int, int]): Patch height and width.
        in_channels (int): Input channels. Defaults to 3.
        embed_dims (int): Output width D. Defaults to 768.
        bias (bool): Bias of the projection. Defaults to True (models with a LayerNorm right after the
            embedding, CLIP's ``pre_norm``, have none).
    """

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
    """``softmax(q k^T / sqrt(d) + bias) v``: the one attention computation of the encoder.

    Args:
        q (Tensor): Queries (..., N, d).
        k (Tensor): Keys (..., M, d).
        v (Tensor): Values (..., M, d).
        bias (Tensor, optional): Broadcastable to (..., N, M): an additive float bias (``-inf``
            excludes a pair) or a boolean mask, True where attention is allowed. Defaults to None.
        dropout_p (float): Dropout on the attention weights; pass 0 outside training. Defaults to 0.
        return_weights (bool): Compute the softmax explicitly and return the weights too (analysis
            tools). Otherwise ``F.scaled_dot_product_attention`` runs, which picks a fused kernel
            and never forms the (N, M) weights. Defaults to False.

    Returns:
        tuple: The output (..., N, d) and the weights (..., N, M), or None without ``return_weights``.
    """
    if not return_weights:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=dropout_p), None
    logits = (q * q.shape[-1]**-0.5) @ k.transpose(-2, -1)
    if bias is not None:
        logits = logits.masked_fill(~bias, float('-inf')) if bias.dtype == torch.bool else logits + bias
    weights = logits.softmax(dim=-1)
    return F.dropout(weights, dropout_p) @ v, weights


def split_heads(qkv: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(B, N, 3, heads, d) -> q, k, v of (B, heads, N, d): strided views, no copies; SDPA takes them."""
    return qkv.permute(2, 0, 3, 1, 4).unbind(0)


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    """(B, heads, N, d) -> (B, N, heads * d). The CPU and CUDA SDPA kernels lay their output out as
    (B, N, heads, d), so for them this is a free view."""
    B, heads, N, d = x.shape
    return x.transpose(1, 2).reshape(B, N, heads * d)


class Attention(nn.Module):
    """Multi-head self-attention with one fused qkv projection, global or within windows.

    Every form goes through :func:`attend`: ``F.scaled_dot_product_attention`` (fused kernels where
    available), or the same softmax computed explicitly when attention weights are requested.

    Args:
        embed_dims (int): Token width D.
        num_heads (int): Number of heads; D must be divisible by it.
        qkv_bias (bool): Bias on the qkv projection. Defaults to True.
        attn_drop (float): Dropout on attention weights while training. Defaults to 0.
        proj_drop (float): Dropout after the output projection while training. Defaults to 0.
        rel_pos_size (tuple[int, int], optional): Patch grid (rows, cols) the decomposed relative
            position tables are made for (ViTDet; see :mod:`vit_plugin.models.rel_pos`); they start
            at zero. The forward pass then needs the patch grid. Defaults to None: no relative bias.
    """

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
        """Dropout probability on the attention weights now (0 in eval mode)."""
        return self.attn_drop if self.training else 0.

    def qkv_tokens(self, x: torch.Tensor) -> torch.Tensor:
        """Tokens (B, N, C) -> their queries, keys and values, (B, N, 3, heads, head_dims)."""
        B, N, _ = x.shape
        return self.qkv(x).reshape(B, N, 3, self.num_heads, self.head_dims)

    def rel_pos_bias(self, q: torch.Tensor, grid: Optional[Tuple[int, int]], span: int = 0) -> Optional[torch.Tensor]:
        """The relative position bias of queries ``q`` (..., N, d) over the same N tokens, or None.

        Tokens before the ``rows * cols`` patches (class token) get zero bias rows and columns.
        ``span`` limits the tables to offsets within windows of that size (dense maps of windowed
        blocks). Defaults to 0: the whole grid.
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
        """(B, N, C) -> (B, N, C); with ``return_attention`` also the (B, heads, N, N) weights.

        Args:
            x (Tensor): Tokens (B, N, C), prefix (class) tokens first.
            return_attention (bool): Also return the attention weights. Defaults to False.
            grid (tuple[int, int], optional): (rows, cols) of the patch tokens; needed with relative
                position bias and with windows. Defaults to None.
            window_size (int): If > 0, patch queries attend only within non-overlapping windows of
                this many patches per side (:func:`windowed_attention`); the weights are then the
                dense (N, N) map, zero outside each window. Defaults to 0: global attention.
            num_prefix_tokens (int): Tokens before the patches (windowed attention only). Defaults to 1.
        """
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
    """Which token may attend to which under windowed attention, as a dense (N, N) boolean matrix.

    Patch tokens see the prefix (class) tokens and the patches of their own ``window_size`` x
    ``window_size`` window (windows tile the grid from the top-left corner; the last row/column of
    windows may be partial). Prefix tokens see everything, as in global attention. Used to return
    attention maps of windowed blocks and as the reference the partitioned computation must match.

    Args:
        grid (tuple[int, int]): Patch grid (rows, cols).
        window_size (int): Window side in patches.
        num_prefix_tokens (int): Class/extra tokens in front of the patches. Defaults to 1.
        device (torch.device, optional): Device of the mask. Defaults to None (CPU).

    Returns:
        torch.Tensor: (N, N) bool, True where attention is allowed, N = prefix + rows * cols.
    """
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
    """Self-attention restricted to non-overlapping windows of the patch grid (ViTDet's local blocks).

    Memory and time grow with the number of windows instead of quadratically with the grid, which is
    what makes ViT affordable at detection resolutions. The grid is zero-padded at the bottom/right
    to whole windows; padded positions are masked out as keys, so results do not depend on padding
    and a window covering the whole grid gives exactly global attention. Prefix (class) tokens stay
    global: they are keys in every window and their queries attend to all tokens. With relative
    position bias (``attn.use_rel_pos``) patch queries add it over the patch keys of their window.

    Args:
        attn (Attention): The block's attention module (its qkv/proj weights are used).
        x (torch.Tensor): Normalised tokens (B, N, C), prefix tokens first.
        grid (tuple[int, int]): Patch grid (rows, cols) of the N - prefix patch tokens.
        window_size (int): Window side in patches.
        num_prefix_tokens (int): Defaults to 1.

    Returns:
        torch.Tensor: (B, N, C), the attention branch output (after the output projection).
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
    """``x * sigmoid(1.702 x)``: the sigmoid approximation of GELU that OpenAI's CLIP was trained with."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(1.702 * x)


#: MLP activations by name: 'gelu' (exact or tanh, see :class:`Mlp`) and CLIP's 'quick_gelu'.
ACTIVATIONS = ('gelu', 'quick_gelu')


class Mlp(nn.Module):
    """Two dense layers with GELU in between (the Transformer's MLP block).

    Args:
        embed_dims (int): Input/output width D.
        hidden_dims (int): Hidden width (the paper's "MLP size").
        gelu_approximate (str): 'none' for exact GELU (PyTorch/timm) or 'tanh' for the approximation
            the official Flax model uses. Defaults to 'none'.
        drop (float): Dropout after each dense layer while training. Defaults to 0.
        activation (str): 'gelu', or 'quick_gelu' for CLIP's :class:`QuickGELU` (then
            ``gelu_approximate`` is not used). Defaults to 'gelu'.
    """

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
    """Hidden width of each half of a SwiGLU MLP standing in for a GELU MLP of width ``mlp_dims``.

    Two thirds of it (SwiGLU has three matrices where the GELU MLP has two, so the parameter count
    stays about the same), rounded up to a multiple of 8: the rule of DINOv2 and of mmpretrain's
    ``SwiGLUFFNFused`` (6144 -> 4096 for DINOv2-g).
    """
    return (int(mlp_dims * 2 / 3) + 7) // 8 * 8


class SwiGLUMlp(nn.Module):
    """SwiGLU MLP with one packed input projection: ``fc2(silu(a) * b)`` where ``(a, b) = fc1(x)`` halves.

    DINOv2-g's MLP (Shazeer, "GLU Variants Improve Transformer"). The names equal timm's
    ``SwiGLUPacked`` (``fc1`` makes both halves, gate first), so its DINOv2 weights copy as they are;
    mmpretrain's ``SwiGLUFFNFused`` calls them ``w12`` and ``w3``.

    Args:
        embed_dims (int): Input/output width D.
        hidden_dims (int): Width of each half (see :func:`swiglu_hidden_dims`).
        drop (float): Dropout after the gating and after ``fc2`` while training. Defaults to 0.
    """

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
    """Learned per-channel scale of a residual branch (CaiT; DINOv2 starts it at 1e-5).

    Args:
        embed_dims (int): Channels.
        init_value (float): Initial value of every channel's scale.
    """

    def __init__(self, embed_dims: int, init_value: float):
        super().__init__()
        self.gamma = nn.Parameter(torch.full((embed_dims, ), float(init_value)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.gamma


class EncoderBlock(nn.Module):
    """Pre-norm Transformer encoder block: ``x + MSA(LN(x))`` then ``x + MLP(LN(x))``.

    With layer scale each branch output is multiplied by a learned per-channel scale before it is
    added: ``x + ls1 * MSA(LN(x))``, ``x + ls2 * MLP(LN(x))`` (DINOv2).

    Args:
        embed_dims (int): Token width D.
        num_heads (int): Attention heads.
        mlp_dims (int): MLP hidden width (for a SwiGLU MLP the nominal width its halves derive from,
            see :func:`swiglu_hidden_dims`).
        qkv_bias (bool): Defaults to True.
        drop (float): Dropout after attention projection and in the MLP. Defaults to 0.
        attn_drop (float): Dropout on attention weights. Defaults to 0.
        drop_path (float): Stochastic-depth probability for both branches. Defaults to 0.
        norm_eps (float): LayerNorm epsilon; 1e-6 as in the official model. Defaults to 1e-6.
        gelu_approximate (str): See :class:`Mlp`. Defaults to 'none'.
        window_size (int): If > 0, attention is restricted to non-overlapping windows of this many
            patches per side (see :func:`windowed_attention`) and ``forward`` needs the patch grid.
            Defaults to 0 (global attention).
        num_prefix_tokens (int): Class/extra tokens in front of the patches; only used by windowed
            attention. Defaults to 1.
        rel_pos_grid (tuple[int, int], optional): Add ViTDet's decomposed relative position bias,
            with tables made for this patch grid (global blocks; resized to other grids on the fly).
            Windowed blocks size theirs to the window. Defaults to None: no relative bias.
        layer_scale_init_value (float): If > 0, scale both branches by :class:`LayerScale` (``ls1``,
            ``ls2``) starting at this value. Defaults to 0 (no layer scale, as in the paper).
        ffn_type (str): 'origin' for the GELU :class:`Mlp`, 'swiglu_fused' for :class:`SwiGLUMlp`
            (mmpretrain's names). Defaults to 'origin'.
        activation (str): Activation of the 'origin' MLP, see :class:`Mlp`. Defaults to 'gelu'.
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
        """Tokens (B, N, D) -> (B, N, D); with ``return_attention`` also the (B, heads, N, N) weights.

        ``grid`` (rows, cols) of the patch tokens is required by windowed blocks and with relative
        position bias, ignored otherwise.
        """
        if self.with_cp and self.training and x.requires_grad and not return_attention:
            # Activation checkpointing: keep only the block input, recompute the rest in backward.
            return checkpoint(self._forward, x, grid, use_reentrant=False)
        return self._forward(x, grid, return_attention)

    def extra_repr(self) -> str:
        return f'window_size={self.window_size}' if self.window_size else ''
