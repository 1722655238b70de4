"""Position-embedding resize: the official mode equals scipy's zoom, the half-pixel modes equal timm's
and mmpretrain's, dtypes, GAP and 2-D tables, and ambiguous grids."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from scipy import ndimage

from vit_plugin.models.pos_embed import infer_grid, resize_pos_embed


def _table(grid, dim=8, prefix=1, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(1, prefix + grid[0] * grid[1], dim, generator=g, dtype=torch.float64).to(dtype)


@pytest.mark.parametrize('old,new', [((14, 14), (24, 24)), ((24, 24), (14, 14)), ((7, 7), (12, 12)),
                                     ((6, 9), (10, 4))])
def test_official_mode_equals_scipy_zoom(old, new):
    table = _table(old)
    # Loading paths compute in float64, like scipy; the float32 default (forward) stays within 1e-5.
    ours = resize_pos_embed(table, new, old_grid=old, mode='official', compute_dtype=torch.float64)
    fast = resize_pos_embed(table, new, old_grid=old, mode='official')
    grid = table[0, 1:].reshape(old[0], old[1], -1).numpy()  # float32, as the official loader gets it
    ref = ndimage.zoom(grid, (new[0] / old[0], new[1] / old[1], 1), order=1)
    assert ref.shape[:2] == new
    assert ours.dtype == torch.float32
    np.testing.assert_allclose(ours[0, 1:].reshape(*new, -1).numpy(), ref, atol=1e-6, rtol=0)
    np.testing.assert_allclose(fast[0, 1:].reshape(*new, -1).numpy(), ref, atol=1e-5, rtol=0)
    assert torch.equal(ours[:, :1], table[:, :1])  # the class-token entry is kept as is


@pytest.mark.parametrize('mode,antialias', [('bicubic', False), ('bicubic', True), ('bilinear', False),
                                            ('bilinear', True)])
@pytest.mark.parametrize('old,new', [((14, 14), (24, 24)), ((24, 24), (14, 14)), ((6, 9), (10, 4))])
def test_half_pixel_modes_equal_timm(mode, antialias, old, new):
    from timm.layers import resample_abs_pos_embed
    table = _table(old)
    ours = resize_pos_embed(table, new, old_grid=old, mode=mode, antialias=antialias)
    ref = resample_abs_pos_embed(table, list(new), list(old), num_prefix_tokens=1, interpolation=mode,
                                 antialias=antialias)
    torch.testing.assert_close(ours, ref, atol=1e-6, rtol=0)


@pytest.mark.parametrize('mode', ['bicubic', 'bilinear'])
def test_half_pixel_modes_equal_mmpretrain_in_float32(mode):
    """mmpretrain's resize (float32 only, no antialias) computes the same table bit for bit."""
    from mmpretrain.models.utils import resize_pos_embed as mmpretrain_resize
    for old, new in [((14, 14), (24, 24)), ((6, 9), (10, 4))]:
        table = _table(old)
        ours = resize_pos_embed(table, new, old_grid=old, mode=mode)
        torch.testing.assert_close(ours, mmpretrain_resize(table, old, new, mode=mode), rtol=0, atol=0)


@pytest.mark.parametrize('dtype,compute', [(torch.float16, torch.float32), (torch.bfloat16, torch.float32),
                                           (torch.float64, torch.float64)])
def test_dtype_preserved_and_computed_in_at_least_float32(dtype, compute):
    table = _table((7, 7), dtype=dtype)
    out = resize_pos_embed(table, (12, 12), mode='official')
    assert out.dtype == dtype and out.shape == (1, 145, 8)
    ref = resize_pos_embed(table.to(compute), (12, 12), mode='official').to(dtype)
    assert torch.equal(out, ref)
    assert torch.equal(out[:, :1], table[:, :1])


def test_gap_tables_and_2d_tables():
    table = _table((4, 4), prefix=0)
    out = resize_pos_embed(table[0], (8, 8), num_prefix_tokens=0, mode='bilinear')
    assert out.shape == (64, 8)
    ref = F.interpolate(table.reshape(1, 4, 4, 8).permute(0, 3, 1, 2), size=(8, 8), mode='bilinear',
                        align_corners=False).permute(0, 2, 3, 1).reshape(64, 8)
    torch.testing.assert_close(out, ref)


def test_ambiguous_non_square_table_asks_for_the_grid():
    with pytest.raises(ValueError, match=r'54 patch entries.*not square.*old_grid=\(rows, cols\)'):
        resize_pos_embed(_table((6, 9)), (12, 12))
    assert infer_grid(54, (9, 6)) == (9, 6)
    with pytest.raises(ValueError, match='needs 49'):
        infer_grid(54, (7, 7))
