"""The timm and mmpretrain key layouts: lossless round trips, extras reported, DINOv2 blocks, direct
loading into our backbone and into mmpretrain's, with equal outputs."""
import pytest
import torch

from helpers.timm_models import TINY, timm_vit
from vit_plugin.converters import ConversionError, mmpretrain_to_vit, timm_to_vit, vit_to_mmpretrain, vit_to_timm
from vit_plugin.models import ViT


def test_timm_round_trip_is_lossless_and_equal_outputs():
    torch.manual_seed(0)
    ref = timm_vit()
    original = ref.state_dict()
    ours_sd, report = timm_to_vit(original)
    report.check()
    back, export = vit_to_timm(ours_sd)
    export.check()
    assert back.keys() == original.keys()
    assert all(torch.equal(back[k], original[k]) for k in original)
    ours = ViT(arch=TINY, img_size=32, patch_size=8).eval()
    ours.load_state_dict({k[9:]: v for k, v in ours_sd.items() if k.startswith('backbone.')})
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(ours.forward_features(x), ref.forward_features(x), atol=1e-5, rtol=0)


def test_timm_extras_are_reported_not_dropped():
    state = timm_vit().state_dict()
    state['fc_norm.weight'] = torch.ones(32)
    _, report = timm_to_vit(state)
    with pytest.raises(ConversionError, match=r"unknown key\(s\) \['fc_norm.weight'\].*--allow-unknown"):
        report.check()
    report.check(allow_unknown=True)


def test_timm_dinov2_blocks_convert_with_equal_outputs():
    """timm's DINOv2 layout (layer scale ``ls1/ls2.gamma``; for the giant model a packed SwiGLU MLP) has our
    names: timm's ``vit_giant_patch14_dinov2`` blocks, at depth 2 and random weights, give our outputs."""
    from timm.layers import SwiGLUPacked
    from timm.models.vision_transformer import VisionTransformer
    torch.manual_seed(0)
    ref = VisionTransformer(img_size=28, patch_size=14, embed_dim=96, depth=2, num_heads=4, mlp_ratio=2.66667 * 2,
                            init_values=1e-5, mlp_layer=SwiGLUPacked, act_layer=torch.nn.SiLU, num_classes=0).eval()
    with torch.no_grad():
        for name, p in ref.named_parameters():  # layer scale at 1e-5 would hide a wrong MLP
            p.copy_(1 + 0.2 * torch.randn_like(p) if name.endswith('gamma') else p + 0.05 * torch.randn_like(p))
    state, report = timm_to_vit(ref.state_dict(), backbone_prefix='')
    report.check()
    # mlp_dims 384 gives SwiGLU halves of 256, timm's 96 * 5.33334 / 2
    ours = ViT(arch=dict(embed_dims=96, num_layers=2, num_heads=4, mlp_dims=384), img_size=28, patch_size=14,
               layer_scale_init_value=1e-5, layer_cfgs=dict(ffn_type='swiglu_fused')).eval()
    ours.load_state_dict(state, strict=True)
    x = torch.randn(2, 3, 28, 28)
    with torch.no_grad():
        torch.testing.assert_close(ours(x)[0], ref(x), atol=1e-5, rtol=0)
    back, report = vit_to_timm(state, backbone_prefix='')
    report.check()
    assert back.keys() == ref.state_dict().keys()


def test_mmpretrain_round_trip_is_lossless():
    torch.manual_seed(0)
    ours = ViT(arch=TINY, img_size=32, patch_size=8).state_dict()
    whole = {**{'backbone.' + k: v for k, v in ours.items()},
             'head.layers.head.weight': torch.randn(5, 32), 'head.layers.head.bias': torch.randn(5)}
    mm, report = vit_to_mmpretrain(whole)
    report.check()
    assert 'backbone.layers.1.ffn.layers.0.0.weight' in mm and 'backbone.ln1.weight' in mm
    assert 'backbone.patch_embed.projection.weight' in mm and 'head.layers.head.weight' in mm
    back, report = mmpretrain_to_vit(mm)
    report.check()
    assert back.keys() == whole.keys() - {'backbone.pos_embed_grid'}
    assert all(torch.equal(back[k], whole[k]) for k in back)


def test_mmpretrain_keys_load_directly_into_our_backbone():
    # A user pointing init_cfg at an mmpretrain checkpoint: the pre-hook renames, nothing is skipped.
    torch.manual_seed(0)
    src = ViT(arch=TINY, img_size=32, patch_size=8).eval()
    mm, _ = vit_to_mmpretrain({'backbone.' + k: v for k, v in src.state_dict().items()})
    dst = ViT(arch=TINY, img_size=48, patch_size=8).eval()
    dst.load_state_dict({k[9:]: v for k, v in mm.items()}, strict=True)
    assert torch.equal(dst.blocks[1].mlp.fc1.weight, src.blocks[1].mlp.fc1.weight)
    assert dst.pos_embed.shape == (1, 37, 32)


def test_mmpretrain_vision_transformer_loads_with_equal_outputs():
    from mmpretrain.models import VisionTransformer
    torch.manual_seed(0)
    ref = VisionTransformer(arch=dict(embed_dims=32, num_layers=2, num_heads=4, feedforward_channels=64),
                            img_size=32, patch_size=8, drop_rate=0., out_type='cls_token')
    ref.init_weights()
    ref.eval()  # (mmpretrain's train() override returns None, so no chaining)
    state, report = mmpretrain_to_vit(ref.state_dict(), backbone_prefix='')
    report.check()
    ours = ViT(arch=TINY, img_size=32, patch_size=8).eval()
    ours.load_state_dict(state, strict=True)
    direct = ViT(arch=TINY, img_size=32, patch_size=8).eval()
    direct.load_state_dict(ref.state_dict(), strict=True)  # mmpretrain names renamed on load
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(ours(x)[0], ref(x)[0], atol=1e-5, rtol=0)
        torch.testing.assert_close(direct(x)[0], ref(x)[0], atol=1e-5, rtol=0)


def test_mmpretrain_names_both_ways_match_mmpretrain(tmp_path):
    """Our keys -> mmpretrain's (the direction derived from the one renaming table) name exactly the
    tensors of mmpretrain's own VisionTransformer."""
    from mmpretrain.models import VisionTransformer
    ref = VisionTransformer(arch=dict(embed_dims=32, num_layers=2, num_heads=4, feedforward_channels=64),
                            img_size=32, patch_size=8, out_type='cls_token')
    ours, report = mmpretrain_to_vit(ref.state_dict(), backbone_prefix='')
    report.check()
    back, report = vit_to_mmpretrain(ours, backbone_prefix='')
    report.check()
    assert back.keys() == ref.state_dict().keys()
    assert all(torch.equal(back[k], v) for k, v in ref.state_dict().items())
