"""The R50+ViT hybrid: official size, the official ResNet numerics, and parity with timm's hybrids.

timm's hybrids differ from the official model in two constants only: weight standardisation
``(w - mean) / sqrt(var + 1e-8)`` instead of ``(w - mean) / (std + 1e-5)``, and GroupNorm eps 1e-5
instead of 1e-6. With those aligned (both standardisation eps 1e-30, GroupNorm 1e-6) the two models are
the same function, which float64 shows to ~1e-13. (The eps is tiny rather than 0 because timm standardises
with ``F.batch_norm`` in training mode, which torch 2.15 refuses with eps 0; at 1e-30 both formulas equal
``(w - mean) / std`` in float64.) With each model's own constants the features differ by a
few 1e-4 on unit-scale outputs (random weights; each standardised conv changes by ~eps/std ~ 1e-3
relative before GroupNorm removes most of it), hence the documented tolerance of 2e-3.
"""
import numpy as np
import pytest
import torch
from mmengine.registry import DefaultScope

import vit_plugin  # noqa: F401
from vit_plugin.models.backbones import HybridViT
from vit_plugin.models.resnet_stem import StdConv2dSame, same_padding, standardize_weight

SMALL = dict(embed_dims=64, num_layers=2, num_heads=2, mlp_dims=128)


def randomise_(model):
    """Random GroupNorm affines (zero-initialised gn3 would hide the residual branch) and jitter."""
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if 'norm' in name and p.dim() == 1 and name.endswith('weight'):
                p.copy_(1 + 0.2 * torch.randn(p.shape, generator=gen))
            else:
                p.add_(0.05 * torch.randn(p.shape, generator=gen))
    return model


def test_r50_b16_official_parameter_count():
    from mmpretrain.registry import MODELS
    cfg = dict(type='ImageClassifier', backbone=dict(type='vit_plugin.HybridViT', arch='b', layers=(3, 4, 9)),
               head=dict(type='VisionTransformerClsHead', num_classes=1000, in_channels=768))
    with DefaultScope.overwrite_default_scope('mmpretrain'), torch.device('meta'):
        model = MODELS.build(cfg)
    assert sum(p.numel() for p in model.parameters()) == 98_659_112
    assert model.backbone.patch_grid == (14, 14)


def test_tf_same_padding_and_weight_standardisation_match_the_official_formulas():
    # TF: out = ceil(n / s); pad = max((out - 1) * s + k - n, 0), the odd one at the end.
    assert same_padding(224, 7, 2) == (2, 3)
    assert same_padding(112, 3, 2) == (0, 1)
    assert same_padding(113, 3, 2) == (1, 1)
    assert same_padding(56, 3, 1) == (1, 1)
    assert same_padding(56, 1, 2) == (0, 0)
    w = torch.randn(8, 4, 3, 3, dtype=torch.float64)
    ref = w.numpy()
    mean = ref.mean(axis=(1, 2, 3), keepdims=True)
    std = ref.std(axis=(1, 2, 3), keepdims=True)  # biased, as jnp.std
    np.testing.assert_allclose(standardize_weight(w).numpy(), (ref - mean) / (std + 1e-5), rtol=1e-12)
    # A 'SAME' stride-2 conv on an even input pads only bottom/right: check one output pixel by hand.
    conv = StdConv2dSame(1, 1, 3, stride=2).double()
    x = torch.randn(1, 1, 6, 6, dtype=torch.float64)
    out = conv(x)
    assert out.shape == (1, 1, 3, 3)
    ws = standardize_weight(conv.weight)[0, 0]
    torch.testing.assert_close(out[0, 0, 0, 0], (x[0, 0, 0:3, 0:3] * ws).sum())
    torch.testing.assert_close(out[0, 0, 2, 2], (x[0, 0, 4:6, 4:6] * ws[:2, :2]).sum())


@pytest.mark.parametrize('name,layers,patch,size', [
    ('vit_base_r50_s16_224', (3, 4, 9), 1, (64, 96)),
    ('vit_tiny_r_s16_p8_224', (), 8, (64, 64)),
], ids=['r50', 'stem-only'])
def test_equals_timm_hybrid(name, layers, patch, size):
    import timm
    torch.manual_seed(0)
    ref = timm.create_model(name, embed_dim=64, depth=2, num_heads=2, mlp_ratio=2., img_size=size, num_classes=0)
    ours = HybridViT(arch=SMALL, layers=layers, patch_size=patch, img_size=size)
    ours.init_weights()
    randomise_(ours)
    ref.load_state_dict(ours.state_dict(), strict=False)  # identical names (ours adds pos_embed_grid)
    assert set(ref.state_dict()) == set(ours.state_dict()) - {'pos_embed_grid'}
    assert ours.patch_grid == tuple(ref.patch_embed.grid_size)
    ours.eval(), ref.eval()
    x = torch.randn(2, 3, *size)
    with torch.no_grad():
        # Each model with its own constants: close, within the documented tolerance.
        torch.testing.assert_close(ours(x)[0], ref.forward_features(x)[:, 0], rtol=0, atol=2e-3)
        # Constants aligned: the same function (float64 removes rounding from the comparison).
        ours.double(), ref.double()
        for model in (ours, ref):
            for module in model.modules():
                if isinstance(module, torch.nn.Conv2d) and hasattr(module, 'eps'):
                    module.eps = 1e-30
                if isinstance(module, torch.nn.GroupNorm):
                    module.eps = 1e-6
        x = x.double()
        torch.testing.assert_close(ours.forward_features(x), ref.forward_features(x), rtol=0, atol=1e-10)


def test_bottlenecks_start_as_identity_on_the_residual_branch():
    model = HybridViT(arch=SMALL, layers=(1, 1), img_size=64)
    model.init_weights()
    resnet = model.patch_embed.backbone
    unit = resnet.stages[1].blocks[0]
    assert torch.count_nonzero(unit.norm3.weight) == 0
    x = torch.randn(1, 256, 16, 16)
    with torch.no_grad():  # gn3 = 0: output = relu(projected shortcut)
        torch.testing.assert_close(unit(x), torch.relu(unit.downsample(x)))
    assert resnet.stem.norm.eps == 1e-6 and resnet.stem.norm.num_groups == 32
    assert resnet.stem.conv.eps == 1e-5


def test_hybrid_outputs_resizing_and_feature_map_padding():
    model = HybridViT(arch=SMALL, layers=(1, 1, 1), img_size=64, out_type='featmap', out_indices=(0, 1)).eval()
    assert model.patch_grid == (4, 4)  # 64 / 16
    with torch.no_grad():
        outs = model(torch.randn(1, 3, 96, 80))  # other size: 6x5 grid, pos-embed resized on the fly
        assert [o.shape for o in outs] == [(1, 64, 6, 5)] * 2
        (odd, ) = HybridViT(arch=SMALL, layers=(1, 1, 1), img_size=64).eval()(torch.randn(1, 3, 70, 70))
        assert odd.shape == (1, 64)  # 'SAME' convs take any size (ceil)
    stem_only = HybridViT(arch=SMALL, layers=(), patch_size=8, img_size=64).eval()
    with pytest.raises(ValueError, match='feature map is 12x12.*pad_to_patch=True'):
        stem_only(torch.randn(1, 3, 48, 48))
    padded = HybridViT(arch=SMALL, layers=(), patch_size=8, img_size=64, pad_to_patch=True, out_type='featmap')
    with torch.no_grad():
        assert padded.eval()(torch.randn(1, 3, 48, 48))[0].shape == (1, 64, 2, 2)


def test_hybrid_frozen_stages_freeze_the_resnet():
    model = HybridViT(arch=SMALL, layers=(1, ), img_size=32, frozen_stages=1)
    model.train()
    assert all(not p.requires_grad for p in model.patch_embed.parameters())
    assert all(p.requires_grad for p in model.blocks[1].parameters())
    assert model.get_layer_depth('patch_embed.backbone.stem.conv.weight') == (0, 4)
