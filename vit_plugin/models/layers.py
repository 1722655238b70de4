"""Building blocks of the ViT encoder: patch embedding, attention, MLP and the pre-norm block.

Parameter names follow timm's (``patch_embed.proj``, ``blocks.N.attn.qkv`` ...) so that converting to
and from timm is a renaming-free copy and third-party tooling that knows timm's layout works on ours.
"""
from typing import Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint


class DropPath(nn.Module):
    """Stochastic depth: drop the whole residual branch per sample while training.

    Args:
        drop_prob (float): Probability of dropping the branch. Defaults to 0.
    """

    def __init__(self, drop_prob: float = 0.):
        super().__init__()
        self.drop_prob = drop_prob

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.drop_prob == 0. or not self.training:
            return x
        keep = 1 - self.drop_prob
        mask = x.new_empty((x.shape[0], ) + (1, ) * (x.dim() - 1)).bernoulli_(keep)
        return x * mask.div_(keep)

    def extra_repr(self) -> str:
        return f'drop_prob={self.drop_prob}'


class PatchEmbed(nn.Module):
    """Split an image into non-overlapping patches and project each one linearly.

    One convolution with kernel = stride = patch size and no padding ('VALID'), as in the paper.

    Args:
        patch_size (tuple[int, int]): Patch height and width.
        in_channels (int): Input channels. Defaults to 3.
        embed_dims (int): Output width D. Defaults to 768.
    """

    def __init__(self, patch_size: Tuple[int, int], in_channels: int = 3, embed_dims: int = 768):
        super().__init__()
        self.patch_size = tuple(patch_size)
        self.proj = nn.Conv2d(in_channels, embed_dims, kernel_size=self.patch_size, stride=self.patch_size)

    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, Tuple[int, int]]:
        """(B, C, H, W) -> tokens (B, h*w, D) and the patch grid (h, w)."""
        x = self.proj(x)
        grid = (x.shape[2], x.shape[3])
        return x.flatten(2).transpose(1, 2), grid


class Attention(nn.Module):
    """Multi-head self-attention with one fused qkv projection.

    Uses ``F.scaled_dot_product_attention`` (fused kernels where available); when attention weights are
    requested (analysis tools) it computes the same softmax explicitly.

    Args:
        embed_dims (int): Token width D.
        num_heads (int): Number of heads; D must be divisible by it.
        qkv_bias (bool): Bias on the qkv projection. Defaults to True.
        attn_drop (float): Dropout on attention weights while training. Defaults to 0.
        proj_drop (float): Dropout after the output projection while training. Defaults to 0.
    """

    def __init__(self, embed_dims: int, num_heads: int, qkv_bias: bool = True, attn_drop: float = 0.,
                 proj_drop: float = 0.):
        super().__init__()
        if embed_dims % num_heads:
            raise ValueError(f'embed_dims ({embed_dims}) must be divisible by num_heads ({num_heads})')
        self.num_heads = num_heads
        self.head_dims = embed_dims // num_heads
        self.scale = self.head_dims**-0.5
        self.attn_drop = attn_drop
        self.qkv = nn.Linear(embed_dims, embed_dims * 3, bias=qkv_bias)
        self.proj = nn.Linear(embed_dims, embed_dims)
        self.proj_drop = nn.Dropout(proj_drop)

    def forward(self, x: torch.Tensor, return_attention: bool = False):
        B, N, C = x.shape
        q, k, v = self.qkv(x).reshape(B, N, 3, self.num_heads, self.head_dims).permute(2, 0, 3, 1, 4).unbind(0)
        attn = None
        if return_attention:
            attn = (q * self.scale) @ k.transpose(-2, -1)
            attn = attn.softmax(dim=-1)
            weights = F.dropout(attn, self.attn_drop, self.training)
            x = weights @ v
        else:
            x = F.scaled_dot_product_attention(q, k, v, dropout_p=self.attn_drop if self.training else 0.)
        x = self.proj_drop(self.proj(x.transpose(1, 2).reshape(B, N, C)))
        return (x, attn) if return_attention else x


class Mlp(nn.Module):
    """Two dense layers with GELU in between (the Transformer's MLP block).

    Args:
        embed_dims (int): Input/output width D.
        hidden_dims (int): Hidden width (the paper's "MLP size").
        gelu_approximate (str): 'none' for exact GELU (PyTorch/timm) or 'tanh' for the approximation
            the official Flax model uses. Defaults to 'none'.
        drop (float): Dropout after each dense layer while training. Defaults to 0.
    """

    def __init__(self, embed_dims: int, hidden_dims: int, gelu_approximate: str = 'none', drop: float = 0.):
        super().__init__()
        self.fc1 = nn.Linear(embed_dims, hidden_dims)
        self.act = nn.GELU(approximate=gelu_approximate)
        self.drop1 = nn.Dropout(drop)
        self.fc2 = nn.Linear(hidden_dims, embed_dims)
        self.drop2 = nn.Dropout(drop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop2(self.fc2(self.drop1(self.act(self.fc1(x)))))


class EncoderBlock(nn.Module):
    """Pre-norm Transformer encoder block: ``x + MSA(LN(x))`` then ``x + MLP(LN(x))``.

    Args:
        embed_dims (int): Token width D.
        num_heads (int): Attention heads.
        mlp_dims (int): MLP hidden width.
        qkv_bias (bool): Defaults to True.
        drop (float): Dropout after attention projection and in the MLP. Defaults to 0.
        attn_drop (float): Dropout on attention weights. Defaults to 0.
        drop_path (float): Stochastic-depth probability for both branches. Defaults to 0.
        norm_eps (float): LayerNorm epsilon; 1e-6 as in the official model. Defaults to 1e-6.
        gelu_approximate (str): See :class:`Mlp`. Defaults to 'none'.
    """

    def __init__(self, embed_dims: int, num_heads: int, mlp_dims: int, qkv_bias: bool = True, drop: float = 0.,
                 attn_drop: float = 0., drop_path: float = 0., norm_eps: float = 1e-6,
                 gelu_approximate: str = 'none'):
        super().__init__()
        self.norm1 = nn.LayerNorm(embed_dims, eps=norm_eps)
        self.attn = Attention(embed_dims, num_heads, qkv_bias=qkv_bias, attn_drop=attn_drop, proj_drop=drop)
        self.norm2 = nn.LayerNorm(embed_dims, eps=norm_eps)
        self.mlp = Mlp(embed_dims, mlp_dims, gelu_approximate=gelu_approximate, drop=drop)
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()
        self.with_cp = False

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.drop_path(self.attn(self.norm1(x)))
        return x + self.drop_path(self.mlp(self.norm2(x)))

    def forward(self, x: torch.Tensor, return_attention: bool = False):
        if return_attention:
            y, attn = self.attn(self.norm1(x), return_attention=True)
            x = x + self.drop_path(y)
            return x + self.drop_path(self.mlp(self.norm2(x))), attn
        if self.with_cp and self.training and x.requires_grad:
            # Activation checkpointing: keep only the block input, recompute the rest in backward.
            return checkpoint(self._forward, x, use_reentrant=False)
        return self._forward(x)
