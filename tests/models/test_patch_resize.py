"""Patch-kernel resize (FlexiViT's pseudo-inverse): upsized and downsized kernels, and parity with timm."""
import pytest
import torch
import torch.nn.functional as F

from vit_plugin.models.patch_resize import resize_patch_embed


# ----------------------------------------------------------------------------- patch-kernel resize
def _kernel(size=16, seed=0):
    return torch.randn(6, 3, size, size, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _token(kernel, patch):
    return F.conv2d(patch, kernel, stride=kernel.shape[-1]).flatten()


def test_patch_kernel_upsized_keeps_tokens_of_upsampled_patches():
    kernel = _kernel(16)
    patch = torch.randn(2, 3, 16, 16, dtype=torch.float64)
    big = F.interpolate(patch, size=(32, 32), mode='bilinear', align_corners=False)
    new = resize_patch_embed(kernel, 32)
    assert new.shape == (6, 3, 32, 32) and new.dtype == torch.float64
    torch.testing.assert_close(_token(new, big), _token(kernel, patch), atol=1e-9, rtol=1e-9)


def test_patch_kernel_downsized_keeps_tokens_in_the_row_space():
    # With bilinear 2x downsizing, a /16 patch made of constant 2x2 blocks (a nearest-upsampled 8x8
    # patch) downsizes to that 8x8 patch exactly; the pseudo-inverse kernel must give the same token.
    kernel = _kernel(16)
    small = torch.randn(2, 3, 8, 8, dtype=torch.float64)
    patch = F.interpolate(small, scale_factor=2, mode='nearest')
    torch.testing.assert_close(F.interpolate(patch, size=(8, 8), mode='bilinear', align_corners=False), small)
    new = resize_patch_embed(kernel, 8)
    torch.testing.assert_close(_token(new, small), _token(kernel, patch), atol=1e-9, rtol=1e-9)


@pytest.mark.parametrize('size', [8, 32])
def test_patch_kernel_resize_equals_timm(size):
    from timm.layers import resample_patch_embed
    kernel = _kernel(16).float()
    ref = resample_patch_embed(kernel, [size, size], interpolation='bilinear', antialias=False)
    torch.testing.assert_close(resize_patch_embed(kernel, size), ref, atol=1e-5, rtol=1e-4)
