"""The ViT backbone: official sizes, parity with timm and with the official formulas, and its options.

References: the exact parameter counts of the paper's models in the official implementation, timm's
``VisionTransformer`` (exact GELU) and an independent float64 NumPy implementation of the official
Flax forward pass (tanh GELU, separate q/k/v heads, LayerNorm eps 1e-6).
"""
import copy
import math
import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from mmengine.registry import DefaultScope
from mmpretrain.registry import MODELS

import vit_plugin  # noqa: F401  (registers vit_plugin.*)
from vit_plugin.checkpoint.records import GELU_KEY
from vit_plugin.models.backbones import ViT

TINY = dict(embed_dims=48, num_layers=3, num_heads=3, mlp_dims=96)
SMALL = dict(embed_dims=32, num_layers=2, num_heads=4)


def build_classifier(backbone: dict, head: dict = None):
    """Build an mmpretrain ImageClassifier from a config, the way users write it."""
    dims = backbone.get('embed_dims', 768)
    cfg = dict(type='ImageClassifier', backbone=dict(type='vit_plugin.ViT', **backbone),
               head=head or dict(type='VisionTransformerClsHead', num_classes=1000, in_channels=dims))
    with DefaultScope.overwrite_default_scope('mmpretrain'):
        return MODELS.build(cfg)


def jitter_(model, std=0.05):
    """Move every parameter off its init (LayerNorm at exactly 1/0 would hide mistakes)."""
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * std)
    return model


# ------------------------------------------------------------------------------------ sizes
@pytest.mark.parametrize('arch,patch,dims,expected', [
    ('b', 16, 768, 86_567_656),
    ('b', 32, 768, 88_224_232),
    ('l', 16, 1024, 304_326_632),
    ('l', 32, 1024, 306_535_400),
    ('h', 14, 1280, 632_045_800),
])
def test_official_parameter_counts(arch, patch, dims, expected):
    # Built on the meta device: shapes without memory, so even ViT-H costs milliseconds.
    with torch.device('meta'):
        model = build_classifier(dict(arch=arch, patch_size=patch),
                                 dict(type='VisionTransformerClsHead', num_classes=1000, in_channels=dims))
    assert sum(p.numel() for p in model.parameters()) == expected


# ------------------------------------------------------------------------------------ parity
@pytest.mark.parametrize('size', [(64, 64), (48, 64)], ids=['64', '48x64'])
@pytest.mark.parametrize('variant', ['cls_token', 'gap'])
def test_equals_timm(variant, size):
    # Patch 16 (both defaults) on a 4x4 and a 3x4 grid; two blocks, timm's default MLP ratio 4.
    from timm.models.vision_transformer import VisionTransformer
    torch.manual_seed(0)
    gap = variant == 'gap'
    ref = VisionTransformer(img_size=size, patch_size=16, embed_dim=48, depth=2, num_heads=3, num_classes=0,
                            class_token=not gap, global_pool='avg' if gap else 'token', fc_norm=False).eval()
    jitter_(ref)
    ours = ViT(arch=dict(embed_dims=48, num_layers=2, num_heads=3, mlp_dims=192), img_size=size,
               with_cls_token=not gap, out_type=variant).eval()
    ours.load_state_dict(ref.state_dict(), strict=True)  # same names: a plain copy
    x = torch.randn(2, 3, *size)
    with torch.no_grad():
        ours_out, ref_out = ours(x)[-1], ref(x)
        torch.testing.assert_close(ours_out, ref_out, rtol=0, atol=1e-5)
        torch.testing.assert_close(ours.forward_features(x), ref.forward_features(x), rtol=0, atol=1e-5)


def test_training_step_equals_timm():
    # A training step, not only the forward: the loss and every gradient against timm's.
    from timm.models.vision_transformer import VisionTransformer
    torch.manual_seed(0)
    ref = jitter_(VisionTransformer(img_size=32, patch_size=8, embed_dim=48, depth=3, num_heads=3, mlp_ratio=2.,
                                    num_classes=0)).train()
    ours = ViT(arch=TINY, img_size=32, patch_size=8).train()
    ours.load_state_dict(ref.state_dict())
    x = torch.randn(2, 3, 32, 32)
    ours(x)[0].pow(2).sum().backward()
    ref(x).pow(2).sum().backward()
    grads = dict(ref.named_parameters())
    for name, p in ours.named_parameters():
        torch.testing.assert_close(p.grad, grads[name].grad, rtol=1e-4, atol=1e-5, msg=name)


def test_bf16_autocast_follows_timm():
    # Mixed precision as users train with it: bf16 activations, fp32 weights and gradients.
    from timm.models.vision_transformer import VisionTransformer
    torch.manual_seed(0)
    ref = jitter_(VisionTransformer(img_size=32, patch_size=8, embed_dim=48, depth=3, num_heads=3, mlp_ratio=2.,
                                    num_classes=0))
    ours = ViT(arch=TINY, img_size=32, patch_size=8)
    ours.load_state_dict(ref.state_dict())
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad(), torch.autocast('cpu', dtype=torch.bfloat16):
        torch.testing.assert_close(ours.eval()(x)[0], ref.eval()(x), rtol=0, atol=1e-5)
    with torch.autocast('cpu', dtype=torch.bfloat16):  # (a new region: autocast caches weight casts)
        loss = ours.train()(x)[0].float().pow(2).sum()
    loss.backward()
    assert ours.blocks[0].mlp.fc2.weight.grad.dtype == torch.float32


def test_torch_compile_matches_eager():
    """``torch.compile`` (Inductor on CPU) traces the whole backbone as one graph, in inference and in
    training, and computes what eager computes: outputs and gradients, global and windowed blocks."""
    torch.compiler.reset()
    torch.manual_seed(0)
    model = ViT(arch=dict(embed_dims=32, num_layers=2, num_heads=2, mlp_dims=64), img_size=32, patch_size=8,
                out_type='featmap', window_size=2, window_block_indices=(0, ))
    compiled = torch.compile(model, fullgraph=True)
    x = torch.randn(2, 3, 32, 48)
    with torch.no_grad():
        model.eval()
        torch.testing.assert_close(compiled(x)[0], model(x)[0], rtol=0, atol=1e-5)
    model.train()
    compiled(x)[0].square().mean().backward()
    compiled_grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    model(x)[0].square().mean().backward()
    for name, param in model.named_parameters():
        torch.testing.assert_close(compiled_grads[name], param.grad, rtol=1e-4, atol=1e-6, msg=name)
    torch.compiler.reset()


def _official_forward_numpy(model: ViT, images: np.ndarray) -> np.ndarray:
    """The official Flax ViT forward pass written from its formulas in float64 NumPy.

    Patches are cut by reshaping (no convolution), q/k/v are separate per-head projections, GELU is
    the tanh form ``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))``, LayerNorm eps 1e-6.
    """
    sd = {k: v.detach().double().numpy() for k, v in model.state_dict().items()}
    D, heads = model.embed_dims, model.arch_settings['num_heads']
    dh = D // heads
    B, C, H, W = images.shape
    p = model.patch_size[0]
    patches = images.reshape(B, C, H // p, p, W // p, p).transpose(0, 2, 4, 1, 3, 5).reshape(B, -1, C * p * p)
    x = patches @ sd['patch_embed.proj.weight'].reshape(D, -1).T + sd['patch_embed.proj.bias']
    x = np.concatenate([np.broadcast_to(sd['cls_token'], (B, 1, D)), x], axis=1) + sd['pos_embed']

    def layer_norm(v, prefix):
        mu = v.mean(-1, keepdims=True)
        var = ((v - mu)**2).mean(-1, keepdims=True)
        return (v - mu) / np.sqrt(var + 1e-6) * sd[prefix + '.weight'] + sd[prefix + '.bias']

    def dense(v, prefix, rows=slice(None)):
        return v @ sd[prefix + '.weight'][rows].T + sd[prefix + '.bias'][rows]

    for i in range(model.num_layers):
        b = f'blocks.{i}.'
        y = layer_norm(x, b + 'norm1')
        q, k, v = (dense(y, b + 'attn.qkv', slice(j * D, (j + 1) * D)).reshape(B, -1, heads, dh) for j in range(3))
        logits = np.einsum('bqhd,bkhd->bhqk', q, k) / np.sqrt(dh)
        weights = np.exp(logits - logits.max(-1, keepdims=True))
        weights /= weights.sum(-1, keepdims=True)
        out = np.einsum('bhqk,bkhd->bqhd', weights, v).reshape(B, -1, D)
        x = x + dense(out, b + 'attn.proj')
        y = dense(layer_norm(x, b + 'norm2'), b + 'mlp.fc1')
        y = 0.5 * y * (1 + np.tanh(np.sqrt(2 / np.pi) * (y + 0.044715 * y**3)))
        x = x + dense(y, b + 'mlp.fc2')
    return layer_norm(x, 'norm')[:, 0]


def test_tanh_gelu_equals_official_formulas():
    torch.manual_seed(0)
    model = ViT(arch=dict(embed_dims=96, num_layers=3, num_heads=3, mlp_dims=384), img_size=64,
                gelu_approximate='tanh').eval()
    model.init_weights()
    jitter_(model, std=0.2)  # large activations: exact and tanh GELU then differ clearly
    x = torch.randn(2, 3, 64, 64)
    reference = _official_forward_numpy(model, x.double().numpy())
    with torch.no_grad():
        out = model(x)[0].double().numpy()
        exact = ViT(arch=model.arch_settings, img_size=64)
        state = model.state_dict()
        # A tanh model records its GELU and loading would switch the exact model to it: drop the
        # record so this model really runs the exact GELU.
        del state[GELU_KEY]
        exact.load_state_dict(state)
        out_exact = exact.eval()(x)[0].double().numpy()
    assert np.abs(out - reference).max() < 1e-5
    # The check discriminates: the exact-GELU model is measurably off the official formulas.
    assert np.abs(out_exact - reference).max() > 1e-4


# ------------------------------------------------------------------------------------ outputs
def test_out_types_are_views_of_the_same_tokens():
    torch.manual_seed(0)
    kwargs = dict(arch=TINY, img_size=(32, 48), patch_size=8)
    raw_model = jitter_(ViT(out_type='raw', **kwargs)).eval()
    x = torch.randn(2, 3, 32, 48)
    outs = {}
    for out_type in ('cls_token', 'gap', 'featmap', 'raw'):
        model = ViT(out_type=out_type, **kwargs).eval()
        model.load_state_dict(raw_model.state_dict())
        with torch.no_grad():
            (outs[out_type], ) = model(x)
    raw = outs['raw']
    assert raw.shape == (2, 1 + 4 * 6, 48)
    torch.testing.assert_close(outs['cls_token'], raw[:, 0])
    torch.testing.assert_close(outs['gap'], raw[:, 1:].mean(1))
    assert outs['featmap'].shape == (2, 48, 4, 6)
    # Row-major: token 1 + r * 6 + c sits at featmap[..., r, c].
    torch.testing.assert_close(outs['featmap'][:, :, 2, 5], raw[:, 1 + 2 * 6 + 5])


def test_out_indices_return_intermediate_blocks_unnormalised_and_last_normalised():
    torch.manual_seed(0)
    model = jitter_(ViT(arch=TINY, img_size=32, patch_size=8, out_type='raw', out_indices=(0, -1))).eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        first, last = model(x)
        tokens, _ = model.embed(x)
        after0 = model.blocks[0](tokens)
        torch.testing.assert_close(first, after0)
        torch.testing.assert_close(last, model.forward_features(x))
    with pytest.raises(ValueError, match='out of range'):
        ViT(arch=TINY, out_indices=3)


def test_without_class_token():
    model = ViT(arch=TINY, img_size=32, patch_size=8, with_cls_token=False, out_type='featmap')
    assert model.cls_token is None and model.pos_embed.shape == (1, 16, 48)
    (out, ) = model(torch.randn(1, 3, 32, 32))
    assert out.shape == (1, 48, 4, 4)
    with pytest.raises(ValueError, match="use 'gap'"):
        ViT(arch=TINY, with_cls_token=False, out_type='cls_token')


def test_other_input_sizes_resize_the_position_embedding():
    model = ViT(arch=TINY, img_size=32, patch_size=8, out_type='featmap').eval()
    (out, ) = model(torch.randn(1, 3, 48, 24))
    assert out.shape == (1, 48, 6, 3)


def test_non_divisible_size_errors_or_pads():
    model = ViT(arch=TINY, img_size=32, patch_size=8).eval()
    with pytest.raises(ValueError, match='not divisible by the patch size 8x8.*pad_to_patch=True'):
        model(torch.randn(1, 3, 30, 32))
    padded = ViT(arch=TINY, img_size=32, patch_size=8, pad_to_patch=True, out_type='featmap').eval()
    padded.load_state_dict(model.state_dict())
    x = torch.randn(1, 3, 30, 27)
    with torch.no_grad():
        (out, ) = padded(x)
        (expected, ) = padded(F.pad(x, (0, 5, 0, 2)))  # zeros at the bottom/right, up to 32x32
    assert out.shape == (1, 48, 4, 4)
    torch.testing.assert_close(out, expected)


# ------------------------------------------------------------------------------------ training
def test_frozen_stages_stay_frozen_after_train():
    model = ViT(arch=TINY, img_size=32, patch_size=8, frozen_stages=2, drop_rate=0.5)
    model.train()
    frozen = [model.patch_embed, model.blocks[0], model.blocks[1]]
    assert all(not m.training for m in frozen) and model.blocks[2].training
    assert not model.pos_embed.requires_grad and not model.cls_token.requires_grad
    assert all(not p.requires_grad for m in frozen for p in m.parameters())
    assert all(p.requires_grad for p in model.blocks[2].parameters()) and model.norm.weight.requires_grad
    model(torch.randn(2, 3, 32, 32))[0].sum().backward()
    assert model.blocks[0].attn.qkv.weight.grad is None
    assert model.blocks[2].attn.qkv.weight.grad is not None


def test_frozen_features_are_deterministic_in_train_mode():
    """With drop_rate > 0 the frozen part (embeddings and their dropout, the first blocks) computes
    the same features in train mode as in eval mode, while the trainable blocks stay stochastic."""
    torch.manual_seed(0)
    model = jitter_(ViT(arch=TINY, img_size=32, patch_size=8, frozen_stages=2, drop_rate=0.5, out_type='raw',
                        out_indices=(1, 2)))
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        frozen_eval, _ = model.eval()(x)
        model.train()
        (frozen_a, last_a), (frozen_b, last_b) = model(x), model(x)
    torch.testing.assert_close(frozen_a, frozen_eval, rtol=0, atol=0)
    torch.testing.assert_close(frozen_b, frozen_eval, rtol=0, atol=0)
    assert not torch.equal(last_a, last_b)  # block 2 is trained: its dropout still acts


def _global_blocks(model: ViT) -> tuple:
    return tuple(i for i in range(model.num_layers) if i not in model.window_block_indices)


def test_default_windowed_blocks_follow_vitdet_for_every_depth():
    """window_block_indices=None keeps the last block of each of 4 stages global; the stages are as
    equal as possible (ViTDet published only 12, 24 and 32 blocks)."""
    published = {12: (2, 5, 8, 11), 24: (5, 11, 17, 23), 32: (7, 15, 23, 31)}
    for depth in range(1, 33):
        arch = dict(embed_dims=8, num_layers=depth, num_heads=1, mlp_dims=8)
        if depth <= 4:  # every block ends a stage: nothing is windowed, and the user is told
            with pytest.warns(UserWarning, match='windows no block'), torch.device('meta'):
                model = ViT(arch=arch, img_size=16, patch_size=8, window_size=1)
            assert model.window_block_indices == () and all(b.window_size == 0 for b in model.blocks)
            continue
        with torch.device('meta'):
            model = ViT(arch=arch, img_size=16, patch_size=8, window_size=1)
        global_blocks = _global_blocks(model)
        ends = [i + 1 for i in global_blocks]  # stage k ends after block ceil(k * depth / 4)
        assert ends == [math.ceil(k * depth / 4) for k in (1, 2, 3, 4)], depth
        lengths = [b - a for a, b in zip([0] + ends, ends)]
        assert max(lengths) - min(lengths) <= 1 and sum(lengths) == depth, depth
        assert [b.window_size for b in model.blocks] == [0 if i in global_blocks else 1 for i in range(depth)]
        if depth in published:
            assert global_blocks == published[depth]
    with torch.device('meta'):  # ten blocks: four global ones, not five
        assert _global_blocks(ViT(arch=dict(TINY, num_layers=10), window_size=2)) == (2, 4, 7, 9)


def test_window_size_that_windows_nothing_warns():
    with pytest.warns(UserWarning, match='window_size=3 windows no block: window_block_indices is empty'):
        ViT(arch=TINY, img_size=32, patch_size=8, window_size=3, window_block_indices=())
    with pytest.warns(UserWarning, match='keeps all 3 blocks global'):
        ViT(arch=TINY, img_size=32, patch_size=8, window_size=3)
    with warnings.catch_warnings():
        warnings.simplefilter('error')
        ViT(arch=TINY, img_size=32, patch_size=8, window_size=3, window_block_indices=(0, ))
        ViT(arch=TINY, img_size=32, patch_size=8)  # window_size=0: global attention, as asked


def test_activation_checkpointing_gives_the_same_gradients():
    torch.manual_seed(0)
    plain = jitter_(ViT(arch=TINY, img_size=32, patch_size=8))
    ckpt = copy.deepcopy(plain)
    ckpt.set_grad_checkpointing(True)
    calls, fc1_forward = [], ckpt.blocks[0].mlp.fc1.forward

    def counting_forward(x):  # (module hooks do not fire during the recomputation)
        calls.append(1)
        return fc1_forward(x)

    ckpt.blocks[0].mlp.fc1.forward = counting_forward
    x = torch.randn(2, 3, 32, 32)
    for model in (plain, ckpt):
        model.train()
        model(x)[0].pow(2).sum().backward()
    assert len(calls) == 2  # forward, then recomputed in backward: checkpointing really ran
    for (name, a), b in zip(plain.named_parameters(), ckpt.parameters()):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-5, atol=1e-6, msg=name)


def test_dropout_and_drop_path_inactive_in_eval():
    torch.manual_seed(0)
    noisy = ViT(arch=TINY, img_size=32, patch_size=8, drop_rate=0.3, attn_drop_rate=0.3, drop_path_rate=0.3)
    clean = ViT(arch=TINY, img_size=32, patch_size=8)
    clean.load_state_dict(noisy.state_dict())
    x = torch.randn(2, 3, 32, 32)
    noisy.train()
    assert not torch.equal(noisy(x)[0], noisy(x)[0])
    noisy.eval(), clean.eval()
    with torch.no_grad():
        torch.testing.assert_close(noisy(x)[0], clean(x)[0], rtol=0, atol=0)


def test_layer_depths_drive_mmpretrain_layer_decay():
    from mmpretrain.registry import OPTIM_WRAPPER_CONSTRUCTORS
    model = build_classifier(dict(arch=TINY, img_size=32, patch_size=8))
    assert model.backbone.get_layer_depth('backbone.pos_embed', 'backbone.') == (0, 5)
    assert model.backbone.get_layer_depth('backbone.patch_embed.proj.weight', 'backbone.') == (0, 5)
    assert model.backbone.get_layer_depth('backbone.blocks.1.mlp.fc1.bias', 'backbone.') == (2, 5)
    assert model.backbone.get_layer_depth('backbone.norm.weight', 'backbone.') == (4, 5)
    assert model.backbone.get_layer_depth('head.layers.head.weight', 'backbone.') == (4, 5)
    assert model.backbone.no_weight_decay() == {'pos_embed', 'cls_token'}
    with DefaultScope.overwrite_default_scope('mmpretrain'):
        constructor = OPTIM_WRAPPER_CONSTRUCTORS.build(dict(
            type='LearningRateDecayOptimWrapperConstructor',
            optim_wrapper_cfg=dict(optimizer=dict(type='AdamW', lr=1.0, weight_decay=0.05)),
            paramwise_cfg=dict(layer_decay_rate=0.5, custom_keys={'.pos_embed': dict(decay_mult=0.)})))
        optim = constructor(model).optimizer
    lr = {g['param_name']: (g['lr'], g['weight_decay']) for g in optim.param_groups}
    assert lr['backbone.patch_embed.proj.weight'][0] == 0.5**4
    assert lr['backbone.blocks.0.attn.qkv.weight'][0] == 0.5**3
    assert lr['head.layers.head.weight'][0] == 1.0
    assert lr['backbone.pos_embed'][1] == 0.


def test_attention_maps_are_distributions_matching_the_fused_path():
    torch.manual_seed(0)
    model = jitter_(ViT(arch=TINY, img_size=32, patch_size=8)).eval()
    x = torch.randn(2, 3, 32, 32)
    maps = model.get_attention_maps(x)
    assert len(maps) == 3 and maps[0].shape == (2, 3, 17, 17)
    for attn in maps:
        assert (attn >= 0).all()
        torch.testing.assert_close(attn.sum(-1), torch.ones(2, 3, 17))
    with torch.no_grad():
        tokens, _ = model.embed(x)
        explicit, _ = model.blocks[0](tokens, return_attention=True)
        torch.testing.assert_close(explicit, model.blocks[0](tokens), rtol=1e-5, atol=1e-6)


def test_every_forward_path_runs_the_one_encoder_loop_and_its_block_runner():
    """forward (one or several out_indices), forward_features, encode and get_attention_maps give exactly
    the blocks run by hand; a block runner (set_block_runner) serves the passes that need only the last
    block, and the loop keeps the ones that need other blocks or the attention."""
    torch.manual_seed(0)
    kwargs = dict(arch=TINY, img_size=32, patch_size=8, window_size=2, window_block_indices=(1, ), use_rel_pos=True)
    model = jitter_(ViT(out_type='raw', out_indices=(0, 2), **kwargs)).eval()
    x = torch.randn(2, 3, 32, 40)  # another grid than the stored one: the table is resized on the fly
    calls = []

    def by_hand(blocks, tokens, grid):
        calls.append(len(blocks))
        for block in blocks:
            tokens = block(tokens, grid=grid)
        return tokens

    with torch.no_grad():
        tokens, grid = model.embed(x)
        after, seen, attention = [tokens], tokens, []
        for block in model.blocks:
            after.append(block(after[-1], grid=grid))
            seen, weights = block(seen, return_attention=True, grid=grid)  # the explicit softmax path
            attention.append(weights)
        final = model.norm(after[-1])
        for runner in (None, by_hand):
            model.set_block_runner(runner)
            first, last = model(x)
            assert torch.equal(first, after[1]) and torch.equal(last, final)
            assert torch.equal(model.forward_features(x), final) and torch.equal(model.encode(tokens, grid), final)
            maps = model.get_attention_maps(x)
            assert len(maps) == 3 and all(torch.equal(a, b) for a, b in zip(maps, attention))
        assert calls == [3, 3]  # forward_features and encode; not the taps of out_indices, nor the maps
        model.out_indices = [2]
        assert torch.equal(model(x)[0], final) and calls == [3, 3, 3]
    with pytest.raises(TypeError, match='set_block_runner takes a callable'):
        model.set_block_runner('scan')


def test_official_initialisation():
    torch.manual_seed(0)
    model = ViT(arch=dict(embed_dims=192, num_layers=1, num_heads=3, mlp_dims=768))
    model.init_weights()
    w = model.patch_embed.proj.weight  # LeCun normal: variance 1 / fan_in, truncated at 2 std
    fan_in = 3 * 16 * 16
    assert abs(w.var().item() * fan_in - 1) < 0.03
    assert w.abs().max().item() <= 2 * math.sqrt(1 / fan_in) / .87962566103423978 + 1e-6
    assert torch.count_nonzero(model.cls_token) == 0
    assert abs(model.pos_embed.std().item() - 0.02) < 0.002
    fc1 = model.blocks[0].mlp.fc1.weight  # Xavier uniform
    assert abs(fc1.abs().max().item() - math.sqrt(6 / (192 + 768))) < 1e-3


# ------------------------------------------------------------------------------------ heads
def test_mmpretrain_head_gives_the_papers_two_phases():
    torch.manual_seed(0)
    pretrain = build_classifier(dict(arch=TINY, img_size=32, patch_size=8),
                                dict(type='VisionTransformerClsHead', num_classes=10, in_channels=48, hidden_dim=64))
    pretrain.init_weights()
    layers = pretrain.head.layers
    assert torch.count_nonzero(layers.head.weight) == 0 and torch.count_nonzero(layers.head.bias) == 0
    assert abs(layers.pre_logits.weight.var().item() * 48 - 1) < 0.2  # LeCun variance
    jitter_(pretrain.head)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        feats = pretrain.backbone(x)[-1]
        expected = layers.head(torch.tanh(layers.pre_logits(feats)))
        torch.testing.assert_close(pretrain(x, mode='tensor'), expected)

    finetune = build_classifier(dict(arch=TINY, img_size=32, patch_size=8),
                                dict(type='VisionTransformerClsHead', num_classes=10, in_channels=48))
    finetune.init_weights()
    assert [n for n, _ in finetune.head.named_parameters()] == ['layers.head.weight', 'layers.head.bias']
    with torch.no_grad():
        assert torch.count_nonzero(finetune(x, mode='tensor')) == 0  # zero-initialised D x K layer

def test_feedforward_channels_is_mlp_dims():
    torch.manual_seed(0)
    ours = ViT(arch=dict(SMALL, mlp_dims=64), img_size=32, patch_size=8)
    torch.manual_seed(0)
    theirs = ViT(arch=dict(SMALL, feedforward_channels=64), img_size=32, patch_size=8)
    assert ours.arch_settings == theirs.arch_settings
    a, b = ours.state_dict(), theirs.state_dict()
    assert list(a) == list(b) and all(torch.equal(a[k], b[k]) for k in a)
    images = torch.randn(2, 3, 32, 32)
    assert torch.equal(ours(images)[-1], theirs(images)[-1])
    # the same through a config, as mmpretrain users write it
    with DefaultScope.overwrite_default_scope('mmpretrain'):
        built = MODELS.build(dict(type='vit_plugin.ViT', arch=dict(SMALL, feedforward_channels=64), img_size=32,
                                  patch_size=8))
    assert built.blocks[0].mlp.fc1.out_features == 64
    with pytest.raises(ValueError, match='both mlp_dims=64 and feedforward_channels=128'):
        ViT(arch=dict(SMALL, mlp_dims=64, feedforward_channels=128))
    with pytest.raises(ValueError, match=r"unknown keys \['mlp_ratio'\]"):
        ViT(arch=dict(SMALL, mlp_dims=64, mlp_ratio=4))
