"""``vit_plugin.ViT`` as a drop-in for mmpretrain's ``VisionTransformer``: its keywords, its outputs, its archs.

The reference is mmpretrain 1.2.0 itself: its backbone is built with random weights, its state dict
converted with our converter and loaded into ours, and every output compared (and back: ours
converted and loaded into it); its parameter counts for every plain-ViT arch of its zoo, built with
the keywords of its own configs; its loading of a classifier checkpoint at another resolution; and
the forward expectations of its backbone tests, restated for ``vit_plugin.ViT``.
"""
import copy
import math
import os.path as osp

import pytest
import torch
import torch.nn.functional as F
from mmengine.config import Config
from mmengine.registry import DefaultScope
from mmengine.runner import load_checkpoint, save_checkpoint
from mmpretrain.models import VisionTransformer

import vit_plugin  # noqa: F401  (registers vit_plugin.*)
from vit_plugin.checkpoint.key_maps import mmpretrain_to_ours_key
from vit_plugin.converters import mmpretrain_to_vit, vit_to_mmpretrain
from vit_plugin.converters.convert_file import convert_checkpoint_file
from vit_plugin.models import ViT

ATOL = 1e-5

#: A small arch, in mmpretrain's words (``feedforward_channels``; ours takes the dict as it is).
SMALL = dict(embed_dims=48, num_layers=2, num_heads=3, feedforward_channels=96)

#: Our arch name -> (mmpretrain's name for the same arch, the keywords its configs use with it).
DINOV2 = dict(img_size=518, patch_size=14, layer_scale_init_value=1e-5)
ARCHS = {
    'deit-t': ('deit-tiny', dict(img_size=224, patch_size=16)),
    'deit-s': ('deit-small', dict(img_size=224, patch_size=16)),
    'deit-b': ('deit-base', dict(img_size=224, patch_size=16)),
    'b': ('base', dict(img_size=224, patch_size=16)),
    'l': ('large', dict(img_size=224, patch_size=16)),
    'h': ('huge', dict(img_size=224, patch_size=14)),
    'dinov2-s': ('dinov2-small', DINOV2),
    'dinov2-b': ('base', DINOV2),  # mmpretrain's DINOv2-B/L configs use 'base'/'large'
    'dinov2-l': ('large', DINOV2),
    'dinov2-g': ('dinov2-giant', dict(DINOV2, layer_cfgs=dict(ffn_type='swiglu_fused'))),
    'eva-g': ('eva-g', dict(img_size=224, patch_size=14)),
}

#: Backbone parameters of the full models above (mmpretrain's counts; no head).
PARAMS = {
    'deit-t': 5_524_416,
    'deit-s': 21_665_664,
    'deit-b': 85_798_656,
    'b': 85_798_656,
    'l': 303_301_632,
    'h': 630_764_800,
    'dinov2-s': 22_056_192,
    'dinov2-b': 86_579_712,
    'dinov2-l': 304_367_616,
    'dinov2-g': 1_136_479_232,
    'eva-g': 1_011_202_432,
}

#: Compared at full depth (5.5M parameters); the others with 2 blocks of their width, heads and MLP:
#: the depth only repeats the block, and the full models' parameters are counted above.
FULL_DEPTH = ('deit-t', )


def randomise_(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Every parameter off its initial value, reproducibly. LayerNorm and layer-scale factors (1-D
    weights) around 1: layer scale starts at 1e-5, which would hide a wrong branch; matrices with
    unit-variance outputs; biases and the token tables small."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen)
            if p.dim() == 1 and name.endswith('weight'):
                p.copy_(1 + 0.2 * noise)
            elif p.dim() >= 2 and not name.endswith(('pos_embed', 'cls_token')):
                p.copy_(noise * p[0].numel()**-0.5)
            else:
                p.copy_(0.2 * noise)
    return model


def in_eval(model: torch.nn.Module) -> torch.nn.Module:
    """``model`` in eval mode (mmpretrain's ``train()``, hence ``eval()``, returns None)."""
    model.eval()
    return model


def ours_from(ref: VisionTransformer, **kwargs) -> ViT:
    """Our backbone with ``ref``'s weights, converted by the converter (a strict load)."""
    state, report = mmpretrain_to_vit(ref.state_dict(), backbone_prefix='')
    report.check()
    ours = ViT(**kwargs).eval()
    ours.load_state_dict(state, strict=True)
    return ours


def max_difference(ours, ref, x) -> float:
    """The largest absolute difference between the outputs (shapes checked first)."""
    with torch.no_grad():
        a, b = ours(x), ref(x)
    assert isinstance(a, tuple) and len(a) == len(b)
    assert [o.shape for o in a] == [r.shape for r in b]
    return max(float((o - r).abs().max()) for o, r in zip(a, b))


def arch_pair(name: str, depth=None):
    """(ours, mmpretrain's) arch arguments for one of :data:`ARCHS`, with ``depth`` blocks if given."""
    mm_name = ARCHS[name][0]
    if depth is None:
        return name, mm_name
    return dict(ViT.arch_zoo[name], num_layers=depth), dict(VisionTransformer.arch_zoo[mm_name], num_layers=depth)


# ------------------------------------------------------------------------------------------ keywords
def test_every_keyword_of_mmpretrains_signature_is_accepted_with_its_default():
    import inspect
    theirs = {k: p.default for k, p in inspect.signature(VisionTransformer.__init__).parameters.items() if k != 'self'}
    assert set(theirs) <= set(inspect.signature(ViT.__init__).parameters)
    with torch.device('meta'):  # ViT-B: names and shapes only
        ref, ours = VisionTransformer(**copy.deepcopy(theirs)), ViT(**copy.deepcopy(theirs))
    state, report = mmpretrain_to_vit(ref.state_dict(), backbone_prefix='')
    report.check()
    assert {k: v.shape for k, v in state.items()} == {k: v.shape for k, v in ours.state_dict().items()
                                                       if k != 'pos_embed_grid'}


# ------------------------------------------------------------------------------------------ archs
@pytest.mark.parametrize('name', list(ARCHS))
def test_arch_parameter_counts_equal_mmpretrains(name):
    # Full models as mmpretrain's configs build them, on the meta device (shapes, no memory).
    mm_name, kwargs = ARCHS[name]
    with torch.device('meta'):
        ours = ViT(arch=name, **kwargs)
        ref = VisionTransformer(arch=mm_name, **kwargs)
    count = sum(p.numel() for p in ours.parameters())
    assert count == sum(p.numel() for p in ref.parameters()) == PARAMS[name]
    alias = {'deit-t': 'deit-tiny', 'dinov2-g': 'dinov2-giant', 'eva-g': 'eva-giant'}.get(name)
    if alias:
        assert ViT.arch_zoo[alias] == ViT.arch_zoo[name]


def built_for_loading(cls, **kwargs):
    """``cls(**kwargs)`` without initial values: its weights are about to be replaced, and drawing
    them is most of the build time of a 1e9-parameter model."""
    with torch.device('meta'):
        model = cls(**copy.deepcopy(kwargs))
    model.to_empty(device='cpu')
    if isinstance(model, ViT):  # the one buffer that is not a weight
        model.pos_embed_grid.copy_(torch.tensor(model.patch_grid))
    return in_eval(model)


@pytest.mark.parametrize('name', list(ARCHS))
def test_arch_outputs_equal_mmpretrains(name):
    """Every out_type of every arch, ``out_indices=[0, -1]``, at a small non-square grid."""
    ours_arch, mm_arch = arch_pair(name, None if name in FULL_DEPTH else 2)
    patch = ARCHS[name][1]['patch_size']
    kwargs = dict(ARCHS[name][1], img_size=(2 * patch, 3 * patch), out_indices=[0, -1])
    torch.manual_seed(0)
    # One set of random weights (avg_featmap's has them all, its LayerNorm after pooling included).
    weights = randomise_(VisionTransformer(arch=mm_arch, out_type='avg_featmap', **copy.deepcopy(kwargs))).state_dict()
    x = torch.randn(2, 3, 2 * patch, 3 * patch)
    for out_type in ('cls_token', 'avg_featmap', 'featmap', 'raw'):
        # (assign=True: the models share the random tensors instead of copying them)
        ref = built_for_loading(VisionTransformer, arch=mm_arch, out_type=out_type, **kwargs)
        ref.load_state_dict({k: v for k, v in weights.items() if out_type == 'avg_featmap' or not k.startswith('ln2.')},
                            strict=True, assign=True)
        state, report = mmpretrain_to_vit(ref.state_dict(), backbone_prefix='')
        report.check()
        ours = built_for_loading(ViT, arch=ours_arch, out_type=out_type, **kwargs)
        ours.load_state_dict(state, strict=True, assign=True)
        assert max_difference(ours, ref, x) <= ATOL, out_type


#: Switches around the arch, each combination built by both libraries with the same keywords.
SWITCHES = {
    'no class token, featmap': dict(with_cls_token=False, out_type='featmap', out_indices=[0, 1]),
    'no class token, avg_featmap, no final norm': dict(with_cls_token=False, out_type='avg_featmap',
                                                        final_norm=False),
    'no class token, raw': dict(with_cls_token=False, out_type='raw', out_indices=-2),
    'no final norm, raw, all blocks': dict(final_norm=False, out_type='raw', out_indices=[0, 1]),
    'no final norm, cls_token': dict(final_norm=False),
    'CLIP: pre_norm, QuickGELU, LN eps 1e-5': dict(pre_norm=True, norm_cfg=dict(type='LN', eps=1e-5),
                                                   layer_cfgs=dict(act_cfg=dict(type='mmpretrain.QuickGELU'))),
    'per-block layer_cfgs': dict(layer_cfgs=[dict(qkv_bias=False, layer_scale_init_value=0.1),
                                             dict(ffn_type='swiglu_fused', norm_cfg=dict(type='LN'))],
                                 out_type='avg_featmap', out_indices=[0, 1]),
    'tanh GELU, no qkv bias': dict(layer_cfgs=dict(act_cfg=dict(type='GELU', approximate='tanh')), qkv_bias=False),
    'patch_cfg: no bias, corner padding': dict(patch_cfg=dict(bias=False, padding='corner'), out_type='featmap'),
    'patch_cfg: same padding': dict(patch_cfg=dict(padding='same'), out_type='featmap'),
    'frozen stages, train mode': dict(frozen_stages=2, drop_rate=0.3),  # frozen: deterministic in both
}


@pytest.mark.parametrize('switches', list(SWITCHES))
def test_switches_give_mmpretrains_outputs(switches):
    kwargs = dict(arch=SMALL, img_size=(32, 24), patch_size=8, **SWITCHES[switches])
    torch.manual_seed(0)
    ref = in_eval(randomise_(VisionTransformer(**copy.deepcopy(kwargs))))
    ours = ours_from(ref, **kwargs)
    # 'padding' cases take a size the patch does not divide (mmpretrain pads by default, ours when asked).
    size = (29, 19) if 'padding' in switches else (32, 24)
    x = torch.randn(2, 3, *size)
    if 'frozen' in switches:
        ref.train(), ours.train()
        for module in (ref.patch_embed, ref.drop_after_pos, *ref.layers):  # mmpretrain's train() unfreezes modes
            module.eval()
    assert max_difference(ours, ref, x) <= ATOL


def test_input_sizes_other_than_img_size_resize_like_mmpretrain():
    # Another grid: both resize the position table on the fly (bicubic), ours also when padding.
    kwargs = dict(arch=SMALL, img_size=32, patch_size=8, out_type='featmap', layer_scale_init_value=0.5)
    ref = in_eval(randomise_(VisionTransformer(**kwargs)))
    ours = ours_from(ref, pad_to_patch=True, **kwargs)
    for size in [(48, 40), (45, 37), (16, 16)]:
        assert max_difference(ours, ref, torch.randn(1, 3, *size)) <= ATOL


@pytest.mark.parametrize('case', ['plain', 'dinov2-g blocks', 'clip', 'no class token'])
def test_ours_converted_loads_into_mmpretrain_with_equal_outputs(case):
    kwargs = {
        'plain': dict(arch=SMALL, out_type='cls_token'),
        'dinov2-g blocks': dict(arch=dict(ViT.arch_zoo['dinov2-g'], num_layers=2), patch_size=14, img_size=28,
                                layer_scale_init_value=1e-5, layer_cfgs=dict(ffn_type='swiglu_fused'),
                                out_type='avg_featmap', out_indices=[0, 1]),
        'clip': dict(arch=SMALL, pre_norm=True, norm_cfg=dict(type='LN', eps=1e-5), final_norm=False,
                     layer_cfgs=dict(act_cfg=dict(type='mmpretrain.QuickGELU')), out_type='raw'),
        'no class token': dict(arch=SMALL, with_cls_token=False, out_type='featmap', out_indices=[0, -1]),
    }[case]
    kwargs = dict(dict(img_size=32, patch_size=8), **kwargs)
    arch = kwargs.pop('arch')
    ours = randomise_(ViT(arch=arch, **kwargs), seed=1).eval()
    state, report = vit_to_mmpretrain(ours.state_dict(), backbone_prefix='')
    report.check()
    mm_arch = dict(arch)
    mm_arch['feedforward_channels'] = mm_arch.pop('mlp_dims', None) or mm_arch['feedforward_channels']
    ref = built_for_loading(VisionTransformer, arch=mm_arch, **kwargs)
    ref.load_state_dict(state, strict=True)
    size = kwargs['img_size']
    assert max_difference(ours, ref, torch.randn(2, 3, size, size)) <= ATOL
    back, report = mmpretrain_to_vit(state, backbone_prefix='')  # and back: nothing lost
    report.check()
    own = {k: v for k, v in ours.state_dict().items() if k != 'pos_embed_grid'}
    assert back.keys() == own.keys() and all(torch.equal(back[k], v) for k, v in own.items())


@pytest.mark.parametrize('frozen_stages', [1, 2])
def test_frozen_stages_freeze_what_mmpretrain_freezes(frozen_stages):
    kwargs = dict(arch=SMALL, img_size=32, patch_size=8, out_type='avg_featmap', pre_norm=True,
                  layer_scale_init_value=1e-5, frozen_stages=frozen_stages, drop_rate=0.1)
    ref, ours = VisionTransformer(**kwargs), ViT(**kwargs)
    frozen = {mmpretrain_to_ours_key(n) for n, p in ref.named_parameters() if not p.requires_grad}
    assert {n for n, p in ours.named_parameters() if not p.requires_grad} == frozen
    assert len(frozen) > 6  # the embeddings and at least one block
    ref.train(), ours.train()  # as a runner does before training
    pairs = [(ours.patch_embed, ref.patch_embed), (ours.drop_after_pos, ref.drop_after_pos),
             *zip(ours.blocks, ref.layers), (ours.norm, ref.ln1), (ours.fc_norm, ref.ln2)]
    frozen_modules = 2 + frozen_stages + (2 if frozen_stages == 2 else 0)
    for i, (mine, theirs) in enumerate(pairs):
        # Ours keeps frozen parts in eval mode (deterministic features); mmpretrain's train()
        # puts them back into train mode, only its constructor set eval (documented difference).
        assert mine.training == (i >= frozen_modules)
        assert theirs.training


# ------------------------------------------------------------------------------ their checkpoints
def _mm_classifier(**backbone):
    from mmpretrain.registry import MODELS
    cfg = dict(type='ImageClassifier', backbone=dict(type='VisionTransformer', **backbone), neck=None,
               head=dict(type='VisionTransformerClsHead', num_classes=5, in_channels=SMALL['embed_dims']))
    with DefaultScope.overwrite_default_scope('mmpretrain'):
        return MODELS.build(cfg)


def test_mmpretrain_classifier_checkpoint_loads_through_init_cfg(tmp_path):
    """An mmpretrain ViT classifier's checkpoint, at 4x4 patches, fine-tuned at 6x6 by our backbone:
    ``init_cfg=Pretrained`` loads it directly, resizing the position table exactly as it resizes our
    own checkpoints; with ``pos_embed_load_mode='bicubic'`` the table equals mmpretrain's own resize."""
    backbone = dict(arch=SMALL, img_size=32, patch_size=8, layer_scale_init_value=1e-5, out_type='cls_token')
    classifier = randomise_(_mm_classifier(**backbone))
    theirs = str(tmp_path / 'mmpretrain_vit.pth')
    save_checkpoint(classifier.state_dict(), theirs)
    ours_file = str(tmp_path / 'ours.pth')
    convert_checkpoint_file(theirs, ours_file, show_progress=False)  # the same weights in our layout

    def load(checkpoint, **kwargs):
        model = ViT(**dict(backbone, img_size=48, **kwargs),
                    init_cfg=dict(type='Pretrained', checkpoint=checkpoint, prefix='backbone.'))
        model.init_weights()
        return model.eval()

    direct, converted = load(theirs), load(ours_file)
    assert direct.pos_embed.shape == (1, 1 + 6 * 6, 48)
    for name, tensor in converted.state_dict().items():
        assert torch.equal(direct.state_dict()[name], tensor), name
    # The default resize is the paper's (align_corners=True bilinear) from the 4x4 table.
    table = classifier.backbone.pos_embed.detach()
    grid = table[:, 1:].reshape(1, 4, 4, 48).permute(0, 3, 1, 2).double()
    expected = F.interpolate(grid, size=(6, 6), mode='bilinear', align_corners=True)
    torch.testing.assert_close(direct.pos_embed[:, 1:].detach().double(),
                               expected.permute(0, 2, 3, 1).reshape(1, 36, 48), rtol=0, atol=1e-6)
    assert torch.equal(direct.pos_embed[:, :1], table[:, :1])

    # mmpretrain's own backbone loading the file at 48 px (bicubic resize) and ours asked to do the same.
    ref = in_eval(VisionTransformer(**dict(backbone, img_size=48)))
    load_checkpoint(ref, theirs, revise_keys=[(r'^backbone\.', '')])
    bicubic = load(theirs, pos_embed_load_mode='bicubic')
    torch.testing.assert_close(bicubic.pos_embed, ref.pos_embed, rtol=0, atol=1e-5)
    assert max_difference(bicubic, ref, torch.randn(2, 3, 48, 48)) <= ATOL


def test_swapping_the_backbone_of_an_mmpretrain_config():
    """docs/backbone.md: take mmpretrain's own DINOv2-S config, change the backbone type, keep every
    keyword; the classifier computes what mmpretrain's does with the same weights."""
    import mmpretrain
    from mmpretrain.registry import MODELS
    path = osp.join(osp.dirname(mmpretrain.__file__), '.mim', 'configs', 'dinov2',
                    'vit-small-p14_dinov2-pre_headless.py')
    theirs = Config.fromfile(path).model
    ours = copy.deepcopy(theirs)
    ours.backbone.type = 'vit_plugin.ViT'
    with DefaultScope.overwrite_default_scope('mmpretrain'):
        ref, model = in_eval(randomise_(MODELS.build(theirs))), in_eval(MODELS.build(ours))
    state, report = mmpretrain_to_vit(ref.state_dict())
    report.check()
    model.load_state_dict(state, strict=True)
    x = torch.randn(1, 3, 56, 42)  # 4x3 patches of 14 px; both resize the 37x37 table on the fly
    with torch.no_grad():
        (out, ), (expected, ) = model.extract_feat(x), ref.extract_feat(x)
    torch.testing.assert_close(out, expected, rtol=0, atol=ATOL)


# ----------------------------------------------------------------------------- keywords refused
@pytest.mark.parametrize('kwargs,message', [
    (dict(norm_cfg=dict(type='BN')), r"type='BN' is not supported.*dict\(type='LN'"),
    (dict(norm_cfg=dict(type='LN', requires_grad=False)), r"\['requires_grad'\].*frozen_stages"),
    (dict(norm_eps=1e-6, norm_cfg=dict(type='LN')), 'say different things'),
    (dict(patch_cfg=dict(kernel_size=8, stride=4)), 'overlapping patches'),
    (dict(patch_cfg=dict(padding=2)), r"padding='corner'"),
    (dict(patch_cfg=dict(norm_cfg=dict(type='LN'))), 'pre_norm=True'),
    (dict(patch_cfg=dict(conv_type='Conv3d')), "conv_type='Conv2d'"),
    (dict(patch_cfg=dict(embed_dims=64)), 'set by arch'),
    (dict(patch_cfg=dict(foo=1)), r"patch_cfg: unknown key\(s\) \['foo'\]"),
    (dict(pad_to_patch=True, patch_cfg=dict(padding='same')), 'keep one of them'),
    (dict(layer_cfgs=dict(ffn_type='moe')), "ffn_type='moe'"),
    (dict(layer_cfgs=dict(act_cfg=dict(type='ReLU'))), "type='GELU'"),
    (dict(layer_cfgs=dict(num_fcs=3)), 'num_fcs=2'),
    (dict(layer_cfgs=dict(feedforward_channels=128)), 'set them in arch'),
    (dict(layer_cfgs=dict(with_cp=True)), r"layer_cfgs: unknown key\(s\) \['with_cp'\]"),
    (dict(layer_cfgs=[dict()]), 'a list of 2 dicts'),
    (dict(out_type='avg'), 'out_type must be one of'),
])
def test_keywords_without_a_meaning_here_are_refused_by_name(kwargs, message):
    with pytest.raises((ValueError, KeyError), match=message):
        ViT(arch=SMALL, img_size=32, patch_size=8, **kwargs)


def test_structure_mismatch_with_a_checkpoint_is_refused(tmp_path):
    # A DINOv2 checkpoint into a config that forgot layer scale would otherwise load non-strictly
    # and run without its scales.
    state = ViT(arch=SMALL, img_size=32, patch_size=8, layer_scale_init_value=1e-5).state_dict()
    with pytest.raises(ValueError, match=r'blocks\.0\.ls1\.gamma.*layer_scale_init_value=1e-5'):
        ViT(arch=SMALL, img_size=32, patch_size=8).load_state_dict(state, strict=False)
    with pytest.raises(ValueError, match=r'norm_pre\.weight: the checkpoint lacks.*pre_norm=False'):
        ViT(arch=SMALL, img_size=32, patch_size=8, pre_norm=True, layer_scale_init_value=1e-5).load_state_dict(state)
    swiglu = ViT(arch=SMALL, img_size=32, patch_size=8, layer_cfgs=dict(ffn_type='swiglu_fused')).state_dict()
    with pytest.raises(ValueError, match="ffn_type='swiglu_fused'"):
        ViT(arch=SMALL, img_size=32, patch_size=8).load_state_dict(swiglu, strict=False)


# ---------------------------------------------------------- mmpretrain's backbone tests, for ours
def test_arch_argument_and_model_structure():
    with pytest.raises(KeyError, match='unknown ViT arch'):
        ViT(arch='unknown')
    with pytest.raises(ValueError, match='must be a dict with keys'):
        ViT(arch=dict(num_layers=24, num_heads=16, feedforward_channels=4096))
    model = ViT(arch=dict(embed_dims=128, num_layers=24, num_heads=16, feedforward_channels=1024), img_size=32)
    assert model.embed_dims == 128 and model.num_layers == 24 and len(model.blocks) == 24
    assert all(b.attn.num_heads == 16 and b.mlp.fc1.out_features == 1024 for b in model.blocks)
    with pytest.raises(TypeError, match='out_indices must be an int or a sequence'):
        ViT(arch=SMALL, out_indices={1: 1})
    with pytest.raises(ValueError, match='out index 13 is out of range'):
        ViT(arch=dict(SMALL, num_layers=12), out_indices=[0, 13])
    # Stochastic depth grows linearly from 0 in the first block to drop_path_rate in the last.
    model = ViT(arch=dict(SMALL, num_layers=12), img_size=32, drop_path_rate=0.1)
    probs = [getattr(b.drop_path, 'drop_prob', 0.) for b in model.blocks]
    assert probs == pytest.approx([0.1 * i / 11 for i in range(12)])
    assert isinstance(ViT(arch=SMALL, img_size=32, pre_norm=True).norm_pre, torch.nn.LayerNorm)
    assert ViT(arch=SMALL, img_size=32, pre_norm=True).patch_embed.proj.bias is None  # CLIP has none


def test_init_cfg_and_checkpoints_of_another_size(tmp_path):
    model = ViT(arch=SMALL, img_size=32, patch_size=8,
                init_cfg=[dict(type='Kaiming', layer='Conv2d', mode='fan_in', nonlinearity='linear')])
    kernel = model.patch_embed.proj.weight.detach().clone()
    assert not model.pos_embed.any()  # zero until initialised
    model.init_weights()
    assert not torch.allclose(kernel, model.patch_embed.proj.weight) and model.pos_embed.any()
    path = str(tmp_path / 'vit.pth')
    save_checkpoint(model.state_dict(), path)
    same = ViT(arch=SMALL, img_size=32, patch_size=8)
    load_checkpoint(same, path, strict=True)
    assert torch.equal(same.pos_embed, model.pos_embed)
    # Twice the resolution: with pos_embed_load_mode='bicubic' the table is resized as timm and
    # mmpretrain do (half-pixel centres).
    bigger = ViT(arch=SMALL, img_size=64, patch_size=8, pos_embed_load_mode='bicubic')
    load_checkpoint(bigger, path, strict=True)
    grid = model.pos_embed.detach()[:, 1:].reshape(1, 4, 4, 48).permute(0, 3, 1, 2)
    expected = F.interpolate(grid, size=(8, 8), mode='bicubic', align_corners=False)
    torch.testing.assert_close(bigger.pos_embed.detach()[:, 1:], expected.permute(0, 2, 3, 1).reshape(1, 64, 48),
                               rtol=0, atol=1e-6)


def test_forward_shapes():
    x = torch.randn(1, 3, 64, 64)
    with pytest.raises(ValueError, match='needs with_cls_token=True'):
        ViT(arch=SMALL, with_cls_token=False, out_type='cls_token')
    with torch.no_grad():
        (featmap, ) = ViT(arch=SMALL, img_size=64, with_cls_token=False, out_type='featmap').eval()(x)
        assert featmap.shape == (1, 48, 4, 4)
        (cls_token, ) = ViT(arch=SMALL, img_size=64).eval()(x)
        assert cls_token.shape == (1, 48)
        outs = ViT(arch=dict(SMALL, num_layers=4), img_size=64, out_indices=[-3, -2, -1]).eval()(x)
        assert len(outs) == 3 and all(o.shape == (1, 48) for o in outs)
        # Dynamic input sizes, with mmpretrain's padding: the feature map has ceil(size / 16) cells.
        model = ViT(arch=SMALL, img_size=64, out_type='featmap', pad_to_patch=True).eval()
        for size in [(64, 64), (80, 80), (80, 97)]:
            (out, ) = model(torch.randn(1, 3, *size))
            assert out.shape == (1, 48, math.ceil(size[0] / 16), math.ceil(size[1] / 16))
