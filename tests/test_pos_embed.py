"""Position-embedding resize, patch-kernel resize and the backbone's load-time adaptation."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from scipy import ndimage

from vit_plugin.checkpoint.records import MODE_KEY, decode_resize_mode, encode_resize_mode
from vit_plugin.models import ViT
from vit_plugin.models import load_adapt
from vit_plugin.models.patch_resize import resize_patch_embed
from vit_plugin.models.pos_embed import RESIZE_MODES, infer_grid, resize_pos_embed

TINY = dict(embed_dims=32, num_layers=2, num_heads=4, mlp_dims=64)


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


# ----------------------------------------------------------------------------- load-time adaptation
class _LogCounter:
    def __init__(self, monkeypatch):
        self.lines = []
        original = load_adapt.print_log

        def record(msg, *args, **kwargs):
            self.lines.append(msg)
            return original(msg, *args, **kwargs)
        monkeypatch.setattr(load_adapt, 'print_log', record)

    def count(self, text):
        return sum(text in line for line in self.lines)


def _vit(img_size=32, patch_size=8, **kwargs):
    torch.manual_seed(0)
    model = ViT(arch=TINY, img_size=img_size, patch_size=patch_size, **kwargs)
    model.init_weights()
    return model.eval()


def test_plain_load_state_dict_resizes_once_with_official_mode_recorded(monkeypatch):
    logs = _LogCounter(monkeypatch)
    src, dst = _vit(32), _vit(48)
    state = src.state_dict()
    state[MODE_KEY] = encode_resize_mode('official')
    assert dst.load_state_dict(state, strict=True)  # the mode key is consumed, not unexpected
    expected = resize_pos_embed(src.pos_embed.detach(), (6, 6), (4, 4), mode='official',
                                compute_dtype=torch.float64)
    assert torch.equal(dst.pos_embed.detach(), expected)
    assert logs.count('Resized position embedding') == 1 and 'mode=official' in logs.lines[0]
    assert dst.pos_embed_grid.tolist() == [6, 6]


def test_non_square_grid_travels_with_our_weights(monkeypatch):
    src, dst = _vit((32, 48)), _vit((48, 32))
    dst.load_state_dict(src.state_dict())  # a 4x6 table that cannot be inferred without metadata
    expected = resize_pos_embed(src.pos_embed.detach(), (6, 4), (4, 6), mode='official',
                                compute_dtype=torch.float64)
    assert torch.equal(dst.pos_embed.detach(), expected)
    state = _vit((32, 56)).state_dict()
    del state['pos_embed_grid']  # third-party weights: 28 patch entries could be 4x7, 7x4, 2x14 ...
    with pytest.raises(ValueError, match=r'pos_embed: cannot infer the patch grid.*pos_embed_grid=\(rows, cols\)'):
        dst.load_state_dict(state)


def test_patch_size_change_resizes_kernel_and_grid(monkeypatch):
    logs = _LogCounter(monkeypatch)
    src, dst = _vit(32, 8), _vit(32, 4)
    dst.load_state_dict(src.state_dict())
    torch.testing.assert_close(dst.patch_embed.proj.weight.detach(),
                               resize_patch_embed(src.patch_embed.proj.weight.detach(), 4))
    assert logs.count('Resized patch-embedding kernel') == 1 and logs.count('Resized position embedding') == 1
    assert tuple(dst.pos_embed.shape) == (1, 65, 32)


def test_wrong_model_fails_clearly():
    dst = _vit(32)
    wide = ViT(arch=dict(TINY, embed_dims=48, num_heads=4, mlp_dims=96), img_size=32, patch_size=8)
    with pytest.raises(ValueError, match='pos_embed: the checkpoint has width 48.*embed_dims=32'):
        dst.load_state_dict(wide.state_dict(), strict=False)
    deep = ViT(arch=dict(TINY, num_layers=3), img_size=32, patch_size=8)
    with pytest.raises(ValueError, match='blocks.2: the checkpoint has 3 encoder blocks'):
        dst.load_state_dict(deep.state_dict(), strict=False)


def test_bare_backbone_takes_the_backbone_part_of_a_whole_model(monkeypatch):
    logs = _LogCounter(monkeypatch)
    src, dst = _vit(32), ViT(arch=TINY, img_size=32, patch_size=8)
    whole = {**{'backbone.' + k: v for k, v in src.state_dict().items()},
             'head.layers.head.weight': torch.randn(5, 32), 'head.layers.head.bias': torch.randn(5)}
    dst.load_state_dict(whole, strict=True)  # the head is left out, so nothing is unexpected
    for key, value in src.state_dict().items():
        assert torch.equal(dst.state_dict()[key], value), key
    assert logs.count('loading its "backbone." part') == 1
    assert 'head.layers.head.weight' in logs.lines[0]


def test_whole_model_with_several_vits_is_refused():
    state = _vit(32).state_dict()
    both = {**{'backbone.' + k: v for k, v in state.items()}, **{'teacher.backbone.' + k: v for k, v in state.items()}}
    with pytest.raises(ValueError, match=r"'backbone.', 'teacher.backbone.'.*ambiguous.*prefix='backbone.'"):
        _vit(32).load_state_dict(both, strict=False)
    other = {'encoder.' + k: v for k, v in state.items()}  # a ViT under another name is not guessed at
    with pytest.raises(ValueError, match="'encoder.'.*prefix='encoder.'"):
        _vit(32).load_state_dict(other, strict=False)


def test_recorded_resize_modes_keep_their_meaning():
    # Files store an index: the table must never be reordered (these indices are in files on disk).
    assert [int(encode_resize_mode(m)) for m in ('official', 'bilinear', 'bicubic')] == [0, 1, 2]
    for mode in RESIZE_MODES:  # every mode the models know can be recorded and read back
        assert decode_resize_mode(encode_resize_mode(mode)) == mode
    with pytest.raises(ValueError, match='pos_embed_resize_mode.*Delete the key'):
        decode_resize_mode(torch.tensor(7))


def _backbone_cfgs(cfg):
    """Every ViT backbone config inside a model config (a classifier's, an MPP model's, a detector's)."""
    if isinstance(cfg, dict):
        if str(cfg.get('type', '')).endswith(('ViT', 'HybridViT')):
            yield cfg
        for value in cfg.values():
            yield from _backbone_cfgs(value)
    elif isinstance(cfg, (list, tuple)):
        for value in cfg:
            yield from _backbone_cfgs(value)


def test_every_config_resizes_checkpoints_by_one_rule():
    """Our checkpoints load at another grid the same way in every config (supervised, MPP, detection)
    as official ones do: the official loader's resize, the backbone's default."""
    import glob
    import inspect
    import os.path as osp

    from mmengine.config import Config
    root = osp.dirname(osp.dirname(osp.abspath(__file__)))
    default = inspect.signature(ViT).parameters['pos_embed_load_mode'].default
    assert default == 'official'
    paths = sorted(glob.glob(osp.join(root, 'configs', '*.py'))
                   + glob.glob(osp.join(root, 'projects', 'masked_patch_prediction', 'configs', '*.py')))
    checked = []
    for path in paths:
        cfg = Config.fromfile(path)
        for backbone in _backbone_cfgs(cfg.get('model', {})):
            assert backbone.get('pos_embed_load_mode', default) == 'official', path
            checked.append(osp.basename(path))
    assert {'vit_b16_in21k_ft_cifar10_384.py', 'vit_b16_mpp-ft_in1k-384.py', 'tiny-vit_digits_ft-mpp.py',
            'mask_rcnn_vit_b16_simplefpn_1x_coco.py'} <= set(checked)


def test_class_token_mismatch_is_explained():
    gap = _vit(32, with_cls_token=False, out_type='gap')
    with pytest.raises(ValueError, match='with_cls_token=True'):
        gap.load_state_dict(_vit(48).state_dict())
    with pytest.raises(ValueError, match='with_cls_token=False'):
        _vit(48).load_state_dict(gap.state_dict())
