"""Checkpoint converters against independent references (timm's own .npz loader, timm and mmpretrain
models) and the command-line tool's checks and atomic writes."""
import functools
import os
import os.path as osp

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from _official_npz import official_arrays, save_npz
from vit_plugin.checkpoint.records import GELU_KEY, NORM_KEY
from vit_plugin.converters import (ConversionError, convert_jax_vit, finetune_transfer, load_official_npz,
                                   mmpretrain_to_vit, timm_to_vit, vit_to_mmpretrain, vit_to_timm)
from vit_plugin.models import HybridViT, ViT

TINY = dict(embed_dims=32, num_layers=2, num_heads=4, mlp_dims=64)


def _timm_vit(token=True, img_size=32, classes=5):
    from timm.models.vision_transformer import VisionTransformer
    return VisionTransformer(img_size=img_size, patch_size=8, embed_dim=32, depth=2, num_heads=4, mlp_ratio=2,
                             num_classes=classes, class_token=token, global_pool='token' if token else 'avg',
                             fc_norm=False).eval()


def _ours_from(checkpoint, **overrides):
    cfg = dict(checkpoint['meta']['model_cfg'])
    cfg.pop('type')
    cfg.update(overrides)
    model = ViT(**cfg).eval()
    state = {k[len('backbone.'):]: v for k, v in checkpoint['state_dict'].items() if k.startswith('backbone.')}
    if 'gelu_approximate' in overrides:
        del state[GELU_KEY]  # the documented way to keep the model's own GELU instead of the recorded one
    model.load_state_dict(state, strict=True)
    return model


VARIANTS = {
    'pre-linen': dict(),
    'pre-linen opt/target/': dict(prefix='opt/target/'),
    'linen params/ (big_vision)': dict(naming='linen', prefix='params/', big_vision_pos=True),
    'linen params/ scanned': dict(naming='linen', prefix='params/', big_vision_pos=True, scanned=True),
    'gap': dict(token=False),
    'pre_logits': dict(pre_logits=24),
}


@pytest.mark.parametrize('variant', list(VARIANTS))
def test_npz_variants_match_timm_loader(tmp_path, variant):
    from timm.models.vision_transformer import _load_weights
    kwargs = VARIANTS[variant]
    path = save_npz(tmp_path / 'vit.npz', official_arrays(**kwargs))
    token = kwargs.get('token', True)
    ref = _timm_vit(token, classes=0 if 'pre_logits' in kwargs else 5)  # timm has no pre_logits layer
    _load_weights(ref, path)
    checkpoint = load_official_npz(path)
    meta = checkpoint['meta']['model_cfg']
    assert meta['arch'] == TINY and meta['patch_size'] == (8, 8) and meta['img_size'] == (32, 32)
    assert meta['with_cls_token'] == token and meta['pos_embed_load_mode'] == 'official'
    ours = _ours_from(checkpoint, gelu_approximate='none')  # timm uses exact GELU
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(ours.forward_features(x), ref.forward_features(x), atol=1e-5, rtol=0)
        torch.testing.assert_close(ours(x)[0], ref.forward_head(ref.forward_features(x), pre_logits=True),
                                   atol=1e-5, rtol=0)
        state = checkpoint['state_dict']
        if 'pre_logits' not in variant:  # timm's loader ignores pre_logits; compare logits otherwise
            logits = F.linear(ours(x)[0], state['head.layers.head.weight'], state['head.layers.head.bias'])
            torch.testing.assert_close(logits, ref(x), atol=1e-5, rtol=0)
        else:
            assert state['head.layers.pre_logits.weight'].shape == (24, 32)
            assert state['head.layers.head.weight'].shape == (5, 24)


def test_linen_names_without_prefix_equal_pre_linen(tmp_path):
    # timm cannot read this layout (Linen names, classic pos-embed key, no prefix); it holds the same
    # arrays as the pre-Linen file under other names, so the conversions must be identical.
    pre = convert_jax_vit(official_arrays(naming='pre-linen', pre_logits=24))[0]
    linen = convert_jax_vit(official_arrays(naming='linen', pre_logits=24))[0]
    assert pre.keys() == linen.keys()
    for key in pre:
        assert torch.equal(pre[key], linen[key]), key


@pytest.mark.parametrize('layers,gn_4d', [((1, 1), True), ((), False)])
def test_hybrid_npz_matches_timm_loader(tmp_path, layers, gn_4d):
    from timm.layers import StdConv2dSame
    from timm.models.resnetv2 import ResNetV2, create_resnetv2_stem
    from timm.models.vision_transformer import VisionTransformer, _load_weights
    from timm.models.vision_transformer_hybrid import HybridEmbed
    path = save_npz(tmp_path / 'r50.npz', official_arrays(hybrid_layers=layers, gn_4d=gn_4d, patch=1, grid=(2, 2)))
    checkpoint = load_official_npz(path)
    cfg = checkpoint['meta']['model_cfg']
    assert cfg['type'] == 'vit_plugin.HybridViT' and cfg['layers'] == layers
    cfg = {k: v for k, v in cfg.items() if k != 'type'}
    ours = HybridViT(**cfg)
    ours.load_state_dict({k[9:]: v for k, v in checkpoint['state_dict'].items() if k.startswith('backbone.')})
    if layers:
        resnet = ResNetV2(layers=layers, num_classes=0, global_pool='', preact=False, stem_type='same',
                          conv_layer=StdConv2dSame)
    else:
        resnet = create_resnetv2_stem(3, 64, stem_type='same', preact=False, conv_layer=StdConv2dSame)
        resnet.feature_info = None
    ref = VisionTransformer(img_size=cfg['img_size'], patch_size=1, embed_dim=32, depth=2, num_heads=4,
                            mlp_ratio=2, num_classes=5, embed_layer=functools.partial(HybridEmbed, backbone=resnet))
    _load_weights(ref, path)
    ours_sd, ref_sd = ours.state_dict(), ref.state_dict()
    names = [k for k in ref_sd if not k.startswith('head.')]
    assert set(names) == set(ours_sd) - {'pos_embed_grid', GELU_KEY, NORM_KEY}
    for name in names:
        assert torch.equal(ours_sd[name], ref_sd[name]), name


def test_timm_round_trip_is_lossless_and_equal_outputs():
    torch.manual_seed(0)
    ref = _timm_vit()
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
    state = _timm_vit().state_dict()
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


def test_finetune_transfer_zero_head_and_pre_logits():
    state = convert_jax_vit(official_arrays(pre_logits=24))[0]
    new, report = finetune_transfer(state, num_classes=7)
    assert not any(k.startswith('head.layers.pre_logits') for k in new)
    assert new['head.layers.head.weight'].shape == (7, 32) and not new['head.layers.head.weight'].any()
    assert new['head.layers.head.bias'].shape == (7, ) and not new['head.layers.head.bias'].any()
    assert {'head.layers.head.weight', 'head.layers.pre_logits.weight'} <= set(report.dropped)
    kept, _ = finetune_transfer(state, num_classes=7, keep_pre_logits=True)
    assert torch.equal(kept['head.layers.pre_logits.weight'], state['head.layers.pre_logits.weight'])
    assert kept['head.layers.head.weight'].shape == (7, 24)
    assert all(torch.equal(new[k], state[k]) for k in state if k.startswith('backbone.'))


# ----------------------------------------------------------------------------- the command-line tool
def _tool():
    from vit_plugin.apis.convert_checkpoint import main
    return main


def test_tool_converts_for_finetuning_and_loads_with_init_cfg(tmp_path, capsys):
    src = save_npz(tmp_path / 'in21k.npz', official_arrays(pre_logits=24))
    dst = str(tmp_path / 'ft.pth')
    assert _tool()([src, dst, '--num-classes', '3', '--img-size', '48', '--arch', 'b']) == 1
    assert "embed_dims=32 (from 'embedding/kernel') where ViT-b has 768" in capsys.readouterr().err
    assert not osp.exists(dst)
    assert _tool()([src, dst, '--num-classes', '3', '--img-size', '48']) == 0
    out = capsys.readouterr().out
    assert 'resized: backbone.pos_embed: 4x4 -> 6x6 patch grid (mode=official)' in out
    assert 'dropped: head.layers.pre_logits.weight' in out and 'missing 0, unknown 0' in out
    model = ViT(arch=TINY, img_size=48, patch_size=8,
                init_cfg=dict(type='Pretrained', checkpoint=dst, prefix='backbone.'))
    model.init_weights()
    arrays = official_arrays(pre_logits=24)
    table = torch.from_numpy(arrays['Transformer/posembed_input/pos_embedding'])
    from scipy import ndimage
    ref = ndimage.zoom(table[0, 1:].reshape(4, 4, 32).numpy(), (1.5, 1.5, 1), order=1)
    np.testing.assert_allclose(model.pos_embed[0, 1:].detach().reshape(6, 6, 32).numpy(), ref, atol=1e-6)
    head = torch.load(dst, weights_only=True)['state_dict']['head.layers.head.weight']
    assert head.shape == (3, 32) and not head.any()


def test_tool_errors_name_the_problem_and_leave_no_file(tmp_path, capsys):
    tool = _tool()
    good = save_npz(tmp_path / 'good.npz', official_arrays())
    truncated = tmp_path / 'truncated.npz'
    truncated.write_bytes(open(good, 'rb').read()[:5000])
    dst = tmp_path / 'out.pth'
    assert tool([str(truncated), str(dst)]) == 1
    assert 'truncated' in capsys.readouterr().err

    torch.save(ViT(arch=TINY, img_size=32, patch_size=8).state_dict(), tmp_path / 'ours.pth')
    half = tmp_path / 'half.pth'
    half.write_bytes((tmp_path / 'ours.pth').read_bytes()[:3000])
    assert tool([str(half), str(dst)]) == 1
    assert 'truncated' in capsys.readouterr().err

    odd = save_npz(tmp_path / 'odd.npz', official_arrays(grid=(4, 7)))
    assert tool([odd, str(dst)]) == 1
    err = capsys.readouterr().err
    assert 'Transformer/posembed_input/pos_embedding' in err and 'pos_embed_grid=(rows, cols)' in err
    assert tool([odd, str(dst), '--pos-embed-grid', '4', '7']) == 0
    assert torch.load(dst, weights_only=True)['state_dict']['backbone.pos_embed_grid'].tolist() == [4, 7]
    os.remove(dst)

    arrays = official_arrays()
    arrays['Transformer/encoderblock_0/LayerScale_0/scale'] = np.ones(32, np.float32)
    extra = save_npz(tmp_path / 'extra.npz', arrays)
    assert tool([extra, str(dst)]) == 1
    assert "'Transformer/encoderblock_0/LayerScale_0/scale'" in capsys.readouterr().err
    del arrays['Transformer/encoder_norm/scale']
    missing = save_npz(tmp_path / 'missing.npz', arrays)
    assert tool([missing, str(dst), '--allow-unknown']) == 1
    assert "'Transformer/encoder_norm/scale'" in capsys.readouterr().err
    assert not dst.exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith('.partial')] == []


def test_tool_write_is_atomic(tmp_path, monkeypatch, capsys):
    tool = _tool()
    src = save_npz(tmp_path / 'vit.npz', official_arrays())
    dst = tmp_path / 'out.pth'
    dst.write_bytes(b'previous contents')
    real_save = torch.save

    def failing_save(obj, f, *args, **kwargs):
        real_save(obj, f, *args, **kwargs)
        f.flush()
        raise OSError('disk full')
    monkeypatch.setattr(torch, 'save', failing_save)
    with pytest.raises(OSError, match='disk full'):
        tool([src, str(dst)])
    assert dst.read_bytes() == b'previous contents'
    assert sorted(p.name for p in tmp_path.iterdir()) == ['out.pth', 'vit.npz']


def test_tool_torch_formats_both_ways(tmp_path, capsys):
    tool = _tool()
    torch.manual_seed(0)
    ref = _timm_vit()
    torch.save(ref.state_dict(), tmp_path / 'timm.pth')
    assert tool([str(tmp_path / 'timm.pth'), str(tmp_path / 'ours.pth'), '--arch', 's']) == 1
    assert "embed_dims=32 (from 'backbone.pos_embed') where ViT-s has 384" in capsys.readouterr().err
    assert tool([str(tmp_path / 'timm.pth'), str(tmp_path / 'ours.pth')]) == 0  # layout detected
    ours = torch.load(tmp_path / 'ours.pth', weights_only=True)
    assert ours['meta']['source_format'] == 'timm' and 'head.layers.head.weight' in ours['state_dict']
    assert tool([str(tmp_path / 'ours.pth'), str(tmp_path / 'back.pth'), '--dst-format', 'timm']) == 0
    back = torch.load(tmp_path / 'back.pth', weights_only=True)
    assert back.keys() == ref.state_dict().keys()
    assert all(torch.equal(back[k], v) for k, v in ref.state_dict().items())
    assert tool([str(tmp_path / 'ours.pth'), str(tmp_path / 'bb.pth'), '--backbone-only']) == 0
    bare = torch.load(tmp_path / 'bb.pth', weights_only=True)['state_dict']
    ViT(arch=TINY, img_size=32, patch_size=8).load_state_dict(bare, strict=True)
    assert tool([str(tmp_path / 'bb.pth'), str(tmp_path / 'ft.pth'), '--num-classes', '2', '--img-size', '48']) == 0
    ft = torch.load(tmp_path / 'ft.pth', weights_only=True)['state_dict']
    assert ft['backbone.pos_embed'].shape == (1, 37, 32) and ft['head.layers.head.weight'].shape == (2, 32)


def test_progress_bar_for_large_files(capsys):
    convert_jax_vit(official_arrays(), show_progress=True)
    err = capsys.readouterr().err
    assert 'converting checkpoint' in err and '32/32' in err  # one step per converted tensor


def test_tool_patch_size_change(tmp_path, capsys):
    src = save_npz(tmp_path / 'p8.npz', official_arrays())
    dst = tmp_path / 'p4.pth'
    assert _tool()([src, str(dst), '--patch-size', '4']) == 0
    out = capsys.readouterr().out
    assert 'patch_embed.proj.weight: 8x8 -> 4x4 kernel' in out and '4x4 -> 8x8 patch grid (mode=official)' in out
    checkpoint = torch.load(dst, weights_only=True)
    cfg = checkpoint['meta']['model_cfg']
    assert cfg['patch_size'] == (4, 4) and cfg['img_size'] == (32, 32)
    model = ViT(arch=TINY, img_size=32, patch_size=4)
    model.load_state_dict({k[9:]: v for k, v in checkpoint['state_dict'].items() if k.startswith('backbone.')})
    kernel = torch.from_numpy(official_arrays()['embedding/kernel'].transpose(3, 2, 0, 1).copy())
    from vit_plugin.models import resize_patch_embed
    torch.testing.assert_close(model.patch_embed.proj.weight.detach(), resize_patch_embed(kernel, 4))


# ----------------------------------------------------------------------------- what the weights record
def test_official_weights_bring_the_gelu_they_were_trained_with(tmp_path):
    """A backbone built with exact GELU (every config's default) runs the tanh GELU of the official
    model once official weights load, and records it in the checkpoints it saves."""
    checkpoint = load_official_npz(save_npz(tmp_path / 'vit.npz', official_arrays()))
    state = {k[len('backbone.'):]: v for k, v in checkpoint['state_dict'].items() if k.startswith('backbone.')}
    reference = ViT(arch=TINY, img_size=32, patch_size=8, gelu_approximate='tanh').eval()
    reference.load_state_dict({k: v for k, v in state.items() if k != GELU_KEY}, strict=True)
    model = ViT(arch=TINY, img_size=32, patch_size=8).eval()
    model.load_state_dict(dict(state), strict=True)  # the record is consumed, not unexpected
    assert {m.approximate for m in model.modules() if isinstance(m, torch.nn.GELU)} == {'tanh'}
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(model(x)[0], reference(x)[0], rtol=0, atol=0)
    saved = model.state_dict()
    assert int(saved[GELU_KEY]) == 1  # 'tanh'
    again = ViT(arch=TINY, img_size=32, patch_size=8).eval()  # e.g. tools/test.py with the same config
    again.load_state_dict(saved, strict=True)
    with torch.no_grad():
        torch.testing.assert_close(again(x)[0], reference(x)[0], rtol=0, atol=0)
    assert GELU_KEY not in ViT(arch=TINY, img_size=32, patch_size=8).state_dict()  # exact GELU: no record


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


def test_models_do_not_import_converters_and_key_names_have_one_home():
    """The models' loading code and the converters share key names through vit_plugin.checkpoint.records
    and vit_plugin.checkpoint.key_maps, which import nothing from the package; the models never import the
    converters."""
    import ast
    package = osp.join(osp.dirname(osp.dirname(osp.abspath(__file__))), 'vit_plugin')

    def imported(path):
        names = []
        for node in ast.walk(ast.parse(open(path).read())):
            if isinstance(node, ast.ImportFrom):
                names.append('.' * node.level + (node.module or ''))
            elif isinstance(node, ast.Import):
                names += [alias.name for alias in node.names]
        return names

    for directory, _, files in os.walk(osp.join(package, 'models')):
        for name in files:
            if name.endswith('.py'):
                path = osp.join(directory, name)
                assert not [m for m in imported(path) if 'converters' in m], path
    for name in ('records.py', 'key_maps.py'):
        names = imported(osp.join(package, 'checkpoint', name))
        assert not [m for m in names if m.startswith('.') or m.startswith('vit_plugin')], (name, names)


def test_tool_resizes_unrecorded_weights_like_the_models_do(tmp_path, capsys):
    """Weights that record no resize mode are resized by the converter with the same rule as by a
    model that loads them: the official loader's (scipy.ndimage.zoom(order=1))."""
    from scipy import ndimage
    torch.manual_seed(0)
    src = ViT(arch=TINY, img_size=32, patch_size=8)
    src.init_weights()
    torch.save(src.state_dict(), tmp_path / 'ours.pth')
    assert _tool()([str(tmp_path / 'ours.pth'), str(tmp_path / 'big.pth'), '--img-size', '48']) == 0
    assert '4x4 -> 6x6 patch grid (mode=official)' in capsys.readouterr().out
    table = torch.load(tmp_path / 'big.pth', weights_only=True)['state_dict']['backbone.pos_embed']
    ref = ndimage.zoom(src.pos_embed.detach()[0, 1:].reshape(4, 4, 32).double().numpy(), (1.5, 1.5, 1), order=1)
    np.testing.assert_allclose(table[0, 1:].reshape(6, 6, 32).double().numpy(), ref, atol=1e-6)
    loaded = ViT(arch=TINY, img_size=48, patch_size=8)
    loaded.load_state_dict(src.state_dict())
    torch.testing.assert_close(loaded.pos_embed.detach(), table, rtol=0, atol=0)
