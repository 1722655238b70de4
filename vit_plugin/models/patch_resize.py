"""FlexiViT's pseudo-inverse resize of a patch kernel (docs/checkpoints.md#every-loading-path)."""
from functools import lru_cache
from typing import Sequence, Tuple, Union

import torch
import torch.nn.functional as F

from .pos_embed import to_2tuple

#: Interpolations that define how a patch is resized (half-pixel centres, PyTorch/timm convention).
PATCH_RESIZE_MODES = ('bilinear', 'bicubic', 'nearest')


@lru_cache(maxsize=16)
def _pinv_resize_matrix(old: Tuple[int, int], new: Tuple[int, int], mode: str, antialias: bool) -> torch.Tensor:
    """``pinv(B^T)`` of shape (new_h*new_w, old_h*old_w) in float64, where ``B`` resizes a patch."""
    n_old = old[0] * old[1]
    basis = torch.eye(n_old, dtype=torch.float64).reshape(n_old, 1, old[0], old[1])
    kwargs = {} if mode == 'nearest' else dict(align_corners=False, antialias=antialias)
    # Row i of ``b_t`` is the resized i-th basis patch, so ``b_t`` is B^T (n_old x n_new).
    b_t = F.interpolate(basis, size=new, mode=mode, **kwargs).reshape(n_old, new[0] * new[1])
    # pinv(M) = M^T pinv(M M^T) = pinv(M^T M) M^T for any M; going through the smaller Gram matrix is
    # cheaper than an SVD of M (docs/checkpoints.md), and interpolation matrices are well conditioned
    # (cond ~2), so squaring the condition number costs nothing in float64.
    # The matrices are small (at most a few thousand rows): LAPACK's threading only adds overhead, and on
    # a busy machine its threads wait for cores, so solve on one thread.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        if b_t.shape[0] <= b_t.shape[1]:
            return b_t.T @ torch.linalg.pinv(b_t @ b_t.T, hermitian=True)
        return torch.linalg.pinv(b_t.T @ b_t, hermitian=True) @ b_t.T
    finally:
        torch.set_num_threads(threads)


def resize_patch_embed(weight: torch.Tensor,
                       new_size: Union[int, Sequence[int]],
                       mode: str = 'bilinear',
                       antialias: bool = False) -> torch.Tensor:
    """Kernel (O, I, kh, kw) -> (O, I, kh', kw') by ``w_new = pinv(B^T) w``, ``B`` interpolating by ``mode``.

    Same dtype and device (solved in float64); ``mode`` one of :data:`PATCH_RESIZE_MODES`."""
    if mode not in PATCH_RESIZE_MODES:
        raise ValueError(f'unknown patch-embedding resize mode {mode!r}; choose one of {PATCH_RESIZE_MODES}')
    if weight.dim() != 4:
        raise ValueError(f'a patch-embedding kernel has shape (out, in, kh, kw), got {tuple(weight.shape)}')
    old, new = tuple(weight.shape[-2:]), to_2tuple(new_size)
    if old == new:
        return weight
    pinv = _pinv_resize_matrix(old, new, mode, bool(antialias and mode != 'nearest')).to(weight.device)
    flat = weight.to(torch.float64).reshape(-1, old[0] * old[1])
    resized = flat @ pinv.T
    return resized.reshape(*weight.shape[:2], *new).to(weight.dtype)
