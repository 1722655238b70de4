"""The official JAX ``.npz`` converter against timm's own loader: every naming variant, the hybrid, and
the GELU the official weights were trained with."""
import functools

import pytest
import torch
import torch.nn.functional as F

from helpers.official_npz import official_arrays, save_npz
from helpers.timm_models import TINY, timm_vit
from vit_plugin.checkpoint.records import GELU_KEY, NORM_EPS_KEY, NORM_KEY
from vit_plugin.converters import convert_jax_vit, load_official_npz
from vit_plugin.models import HybridViT, ViT


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
    ref = timm_vit(token, classes=0 if 'pre_logits' in kwargs else 5)  # timm has no pre_logits layer
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
    assert set(names) == set(ours_sd) - {'pos_embed_grid', GELU_KEY, NORM_EPS_KEY, NORM_KEY}
    for name in names:
        assert torch.equal(ours_sd[name], ref_sd[name]), name


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
