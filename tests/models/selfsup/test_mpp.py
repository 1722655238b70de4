"""Masked patch prediction: corruption statistics, targets, loss masking, configs, training."""
import copy
import math
import os.path as osp

import pytest
import torch
import torch.nn.functional as F
from mmengine.registry import DefaultScope

from helpers.common import REPO
import vit_plugin  # noqa: F401  (registers the components)
from vit_plugin.models.selfsup import targets as T
from vit_plugin.models.selfsup.corruption import (ACTION_KEEP, ACTION_MASK, ACTION_RANDOM, apply_corruption,
                                                  num_corrupted, sample_corruption)

PROJECT = osp.join(REPO, 'projects', 'masked_patch_prediction')
TINY_ARCH = dict(embed_dims=32, num_layers=2, num_heads=2, mlp_dims=64)


@pytest.fixture(autouse=True)
def mmpretrain_scope():
    """Every test builds in mmpretrain's scope, as an mmpretrain config does, whatever scope a runner of
    an earlier test in this process left current."""
    with DefaultScope.overwrite_default_scope('mmpretrain'):
        yield


def build_mpp(target='mean_color_3bit', img_size=32, patch_size=8, backbone=None, **kwargs):
    """A tiny MPP model; ``backbone`` updates the ViT config."""
    from mmpretrain.registry import MODELS
    model = MODELS.build(dict(
        type='vit_plugin.MaskedPatchPrediction',
        data_preprocessor=dict(type='SelfSupDataPreprocessor', mean=[127.5] * 3, std=[127.5] * 3, to_rgb=True),
        backbone=dict(type='vit_plugin.ViT', arch=TINY_ARCH, img_size=img_size, patch_size=patch_size,
                      **(backbone or {})),
        head=dict(type='vit_plugin.MPPHead', in_channels=TINY_ARCH['embed_dims'], target=target,
                  patch_size=patch_size),
        **kwargs))
    model.init_weights()
    return model


# ---------------------------------------------------------------------------------------- corruption
@pytest.mark.parametrize('ratio,num_patches', [(0.5, 196), (0.15, 64)])
def test_corruption_proportions(ratio, num_patches):
    torch.manual_seed(0)
    B = 200
    plan = sample_corruption(B, num_patches, corrupt_ratio=ratio)
    K = num_corrupted(num_patches, ratio)
    assert plan.ids.shape == plan.actions.shape == plan.sources.shape == (B, K)
    # Exactly K distinct positions per image, i.e. the requested share of the patches.
    mask = plan.position_mask()
    assert torch.equal(mask.sum(1), torch.full((B, ), float(K)))
    assert abs(K / num_patches - ratio) <= 0.5 / num_patches
    # Every position is corrupted equally often (uniform choice): 2000+ draws per position at 50%.
    if ratio == 0.5:
        per_position = mask.mean(0)
        assert (per_position - 0.5).abs().max() < 0.15
    # 80 / 10 / 10 among the corrupted patches, within 5 standard errors of a binomial share.
    n = plan.actions.numel()
    for action, share in ((ACTION_MASK, 0.8), (ACTION_RANDOM, 0.1), (ACTION_KEEP, 0.1)):
        observed = (plan.actions == action).float().mean().item()
        assert abs(observed - share) < 5 * math.sqrt(share * (1 - share) / n), (action, observed)


def test_corruption_ratio_option():
    plan = sample_corruption(4, 100, corrupt_ratio=0.15, mask_prob=1.0, random_prob=0.0)
    assert plan.ids.shape == (4, 15)
    assert (plan.actions == ACTION_MASK).all()
    with pytest.raises(ValueError, match='sum to'):
        sample_corruption(4, 100, mask_prob=0.8, random_prob=0.3)


@pytest.mark.parametrize('source', ['batch', 'image'])
def test_random_other_patch_is_never_the_patch_itself(source):
    torch.manual_seed(1)
    B, N = 8, 4  # few patches: a self-pick would be frequent if it were possible
    seen_other_image = False
    for _ in range(50):
        plan = sample_corruption(B, N, random_source=source)
        own = plan.ids + N * torch.arange(B)[:, None]
        assert (plan.sources != own).all()
        assert ((plan.sources >= 0) & (plan.sources < B * N)).all()
        same_image = plan.sources // N == torch.arange(B)[:, None]
        if source == 'image':
            assert same_image.all()
        seen_other_image |= bool((~same_image).any())
    assert seen_other_image == (source == 'batch')


def test_apply_corruption_writes_each_action():
    torch.manual_seed(2)
    B, N, D = 6, 16, 5
    patches = torch.randn(B, N, D)
    mask_token = torch.full((1, 1, D), 42.)
    plan = sample_corruption(B, N, mask_prob=0.4, random_prob=0.3)
    out = apply_corruption(patches, plan, mask_token)
    flat = patches.reshape(B * N, D)
    corrupted = plan.position_mask().bool()
    assert torch.equal(out[~corrupted], patches[~corrupted])  # clean patches untouched
    for b in range(B):
        for k in range(plan.ids.shape[1]):
            n, action = plan.ids[b, k], plan.actions[b, k]
            expected = {ACTION_MASK: mask_token[0, 0], ACTION_RANDOM: flat[plan.sources[b, k]],
                        ACTION_KEEP: patches[b, n]}[int(action)]
            assert torch.equal(out[b, n], expected)


# ---------------------------------------------------------------------------------------- targets
def _solid(colors, patch=16, grid=(1, 2)):
    """An image (1, 3, H, W) whose patches are solid colours, row-major."""
    img = torch.zeros(1, 3, grid[0] * patch, grid[1] * patch)
    for i, color in enumerate(colors):
        r, c = divmod(i, grid[1])
        img[0, :, r * patch:(r + 1) * patch, c * patch:(c + 1) * patch] = torch.tensor(color, dtype=torch.float)[:, None, None]
    return img


def test_mean_color_target_of_solid_patches():
    # 3 bits per channel: level = value // 32; class = R * 64 + G * 8 + B.
    img = _solid([(200, 40, 255), (31, 32, 0)])
    target = T.compute_targets('mean_color_3bit', img, (16, 16))
    assert target.tolist() == [[6 * 64 + 1 * 8 + 7, 0 * 64 + 1 * 8 + 0]]


def test_mean_color_target_averages_the_patch():
    img = _solid([(0, 0, 0)])
    img[0, 0, :, :8] = 128.  # left half of the red channel: mean red 64 -> level 2
    img[0, 2, :8] = 255.  # top half of the blue channel: mean 127.5 -> level 3
    assert T.compute_targets('mean_color_3bit', img[..., :16], (16, 16)).tolist() == [[2 * 64 + 0 * 8 + 3]]


def test_downsized_4x4_target_on_a_known_pattern():
    # One 16x16 patch whose 4x4 cells have grey levels 0..15 (value 16*i + 8 -> 3-bit level i // 2),
    # plus a one-pixel dot that the 4x4 averaging must dilute (cell mean 255/16 ~ 16 -> level 0).
    img = torch.zeros(1, 3, 16, 16)
    for i in range(16):
        r, c = divmod(i, 4)
        img[0, :, 4 * r:4 * r + 4, 4 * c:4 * c + 4] = 16 * i + 8
    img[0, :, 0:4, 0:4] = 0.
    img[0, :, 0, 0] = 255.
    target = T.compute_targets('downsized_4x4_3bit', img, (16, 16))
    expected = [0] + [(i // 2) * 73 for i in range(1, 16)]  # grey: class = level * (64 + 8 + 1)
    assert target.shape == (1, 1, 16)
    assert target[0, 0].tolist() == expected


def test_pixel_target_layout_and_scale():
    img = torch.arange(2 * 2 * 3, dtype=torch.float).reshape(1, 2, 2, 3).permute(0, 3, 1, 2) * 10
    target = T.compute_targets('pixel_l2', img, (2, 2))
    # (row, column, channel) order, pixels mapped from [0, 255] to [-1, 1].
    assert torch.allclose(target, (torch.arange(12.) * 10 / 127.5 - 1).reshape(1, 1, 12))
    assert torch.allclose(T.pixels_from_pixel_target(target, (2, 2))[0, 0], img[0].permute(1, 2, 0))


def test_targets_reject_sizes_that_do_not_tile():
    with pytest.raises(ValueError, match='not divisible'):
        T.compute_targets('mean_color_3bit', torch.zeros(1, 3, 20, 16), (16, 16))
    with pytest.raises(ValueError, match='unknown MPP target'):
        T.compute_targets('hog', torch.zeros(1, 3, 16, 16), (16, 16))


@pytest.mark.parametrize('preprocessor', [
    dict(type='SelfSupDataPreprocessor', mean=[127.5] * 3, std=[127.5] * 3, to_rgb=True),
    dict(type='SelfSupDataPreprocessor', mean=[123.675, 116.28, 103.53], std=[58.395, 57.12, 57.375], to_rgb=True),
    dict(type='ClsDataPreprocessor', mean=[123.675, 116.28, 103.53], std=[58.395, 57.12, 57.375], to_rgb=False),
    dict(type='SelfSupDataPreprocessor'),
])
def test_unnormalize_inverts_the_preprocessor(preprocessor):
    from mmengine.registry import DefaultScope
    from mmpretrain.registry import MODELS
    from mmpretrain.structures import DataSample
    with DefaultScope.overwrite_default_scope('mmpretrain'):  # whatever scope another test's runner left
        preprocessor = MODELS.build(preprocessor)
    torch.manual_seed(3)
    bgr = torch.randint(0, 256, (2, 3, 8, 8), dtype=torch.uint8)
    out = preprocessor(dict(inputs=list(bgr), data_samples=[DataSample(), DataSample()]) if
                       type(preprocessor).__name__ == 'ClsDataPreprocessor' else dict(inputs=bgr, data_samples=None))
    pixels = T.unnormalize(out['inputs'], preprocessor)
    swapped = getattr(preprocessor, '_channel_conversion', False)
    expected = bgr[:, [2, 1, 0]] if swapped else bgr
    assert torch.allclose(pixels, expected.float(), atol=1e-3)
    # Exactly the integer levels after rounding, so bin edges are hit exactly.
    assert torch.equal(T.quantize(pixels), torch.div(expected.long(), 32, rounding_mode='floor'))


def test_targets_in_the_model_use_unnormalised_pixels():
    model = build_mpp(patch_size=16, img_size=32)
    rgb = _solid([(200, 40, 255), (31, 32, 0), (255, 255, 255), (0, 0, 0)], grid=(2, 2))
    bgr = rgb[:, [2, 1, 0]].to(torch.uint8)
    inputs = model.data_preprocessor(dict(inputs=bgr, data_samples=None))['inputs']
    assert model._targets(inputs).tolist() == [[6 * 64 + 8 + 7, 8, 511, 0]]


# ---------------------------------------------------------------------------------------- model
def _fixed_plan(model, B, N):
    torch.manual_seed(4)
    plan = sample_corruption(B, N, model.corrupt_ratio, model.mask_prob, model.random_prob)
    model.sample_corruption = lambda *args, **kwargs: plan
    return plan


@pytest.mark.parametrize('target', ['mean_color_3bit', 'downsized_4x4_3bit', 'pixel_l2'])
def test_loss_only_on_corrupted_positions(target):
    model = build_mpp(target=target).eval()
    torch.manual_seed(5)
    inputs = torch.randn(3, 3, 32, 32)
    plan = _fixed_plan(model, 3, 16)
    clean = (1 - plan.position_mask()).bool()
    reference = model.loss(inputs)['loss']

    # Independent recomputation: head outputs at the corrupted positions against their targets.
    latent, _ = model.encode_corrupted(inputs, plan)
    pred = model.head(latent)
    tgt = model._targets(inputs)
    sel = plan.position_mask().bool()
    if target == 'pixel_l2':
        manual = F.mse_loss(pred[sel], tgt[sel])
    else:
        manual = F.cross_entropy(pred[sel].reshape(-1, 512), tgt[sel].reshape(-1))
    assert torch.allclose(reference, manual, rtol=1e-5)

    # Replace the output representations at clean positions by noise: the loss must not move; the
    # same noise at one corrupted position must move it.
    def loss_with_noise_at(where):
        def add_noise(module, args, out):
            noise = torch.zeros_like(out)
            noise[:, 1:][where] = 10 * torch.randn(int(where.sum()), out.shape[-1])
            return out + noise
        handle = model.backbone.norm.register_forward_hook(add_noise)
        try:
            return model.loss(inputs)['loss']
        finally:
            handle.remove()

    assert torch.allclose(loss_with_noise_at(clean), reference, rtol=1e-6)
    one_corrupted = torch.zeros_like(clean)
    one_corrupted[0, plan.ids[0, 0]] = True
    assert not torch.allclose(loss_with_noise_at(one_corrupted), reference, rtol=1e-3)


def test_corrupting_embeddings_keeps_position_embedding():
    """A [mask]ed patch enters the encoder as mask token + its slot's position embedding."""
    model = build_mpp(mask_prob=1.0, random_prob=0.0).eval()
    plan = _fixed_plan(model, 2, 16)
    captured = {}
    first = model.backbone.blocks[0]
    handle = first.register_forward_pre_hook(lambda mod, args: captured.setdefault('x', args[0]))
    model.encode_corrupted(torch.randn(2, 3, 32, 32), plan)
    handle.remove()
    x = captured['x']
    n = plan.ids[0, 0]
    expected = model.mask_token[0, 0] + model.backbone.pos_embed[0, 1 + n]
    assert torch.allclose(x[0, 1 + n], expected, atol=1e-6)


def test_no_data_dependent_shapes():
    """The training step contains no op whose output size depends on values (XLA compiles it once)."""
    from torch.fx.experimental.proxy_tensor import make_fx
    model = build_mpp(random_source='batch').train()
    graph = make_fx(lambda x: model.loss(x)['loss'])(torch.randn(2, 3, 32, 32))
    ops = {str(node.target) for node in graph.graph.nodes if node.op == 'call_function'}
    assert any('scatter' in op for op in ops) and any('gather' in op for op in ops)
    dynamic = {op for op in ops if any(k in op for k in ('nonzero', 'masked_select', 'unique', '_local_scalar'))}
    assert not dynamic


def test_head_checks_and_accuracy():
    with pytest.raises(ValueError, match='patch size'):
        build_mpp(patch_size=8).__class__(
            backbone=dict(type='vit_plugin.ViT', arch=TINY_ARCH, img_size=32, patch_size=8),
            head=dict(type='vit_plugin.MPPHead', in_channels=32, patch_size=16))
    from vit_plugin.models.selfsup import MPPHead
    head = MPPHead(in_channels=4, target='mean_color_3bit')
    with torch.no_grad():
        head.fc.weight.zero_()
        head.fc.bias.zero_()
        head.fc.bias[7] = 100.
    out = head.loss(torch.randn(2, 3, 4), torch.tensor([[7, 7, 1], [7, 7, 7]]))
    assert out['acc'].item() == pytest.approx(500 / 6)
    assert out['loss'].item() == pytest.approx(100 / 6, rel=1e-4)  # one wrong of six, logit gap 100


@pytest.mark.parametrize('bad', [dict(random_source='dataset'), dict(corrupt_ratio=0.),
                                 dict(mask_prob=0.8, random_prob=0.3)])
def test_bad_corruption_settings_fail_when_built(bad):
    """The model refuses at construction exactly what the sampler would refuse at the first step."""
    with pytest.raises(ValueError) as built:
        build_mpp(**bad)
    with pytest.raises(ValueError) as sampled:
        sample_corruption(2, 16, **bad)
    assert str(built.value) == str(sampled.value)


@pytest.mark.parametrize('head_patch', [4, 16])  # the backbone's patch_size, the pixels per token
def test_hybrid_backbone_is_refused(head_patch):
    """Hybrid tokens see beyond their own patch, so corrupting a token would not hide its pixels."""
    from mmpretrain.registry import MODELS
    backbone = dict(type='vit_plugin.HybridViT', arch=TINY_ARCH, layers=(), patch_size=4, img_size=32)
    # Why: pixels of the second 16x16 patch (one token of this stem-only hybrid) move the first
    # token, while a plain ViT's first token depends on its own patch alone.
    torch.manual_seed(7)
    x = torch.rand(1, 3, 32, 32)
    y = x.clone()
    y[..., :16, 16:] = torch.rand(1, 3, 16, 16)
    for cfg, leaks in ((backbone, True), (dict(type='vit_plugin.ViT', arch=TINY_ARCH, patch_size=16, img_size=32),
                                          False)):
        net = MODELS.build(cfg)
        with torch.no_grad():
            first = [net.patch_embed(image)[0][0, 0] for image in (x, y)]
        assert torch.allclose(*first, rtol=0, atol=1e-6) != leaks, cfg['type']
    with pytest.raises(TypeError, match='each embed one image patch.*HybridEmbed'):
        MODELS.build(dict(type='vit_plugin.MaskedPatchPrediction', backbone=backbone,
                          head=dict(type='vit_plugin.MPPHead', in_channels=32, patch_size=head_patch)))


def test_targets_must_match_the_tokens():
    """A patch size that does not describe the tokens is an error, not a gather of other patches' targets."""
    model = build_mpp(patch_size=8)  # 32 px images: 4x4 tokens
    model.backbone.patch_size = (4, 4)  # now the targets are computed on an 8x8 grid
    inputs = torch.randn(2, 3, 32, 32)
    with pytest.raises(ValueError, match='64 MPP targets .* 16 patch tokens'):
        model.loss(inputs)
    with pytest.raises(ValueError, match='64 MPP targets .* 16 patch tokens'):
        model.predict_corrupted(inputs)


@pytest.mark.parametrize('extra', [
    dict(window_size=3, window_block_indices=(0, )),
    dict(use_rel_pos=True),
    dict(window_size=3, window_block_indices=(0, ), use_rel_pos=True),
], ids=['window', 'rel_pos', 'window+rel_pos'])
def test_mpp_uses_the_backbone_encoder(extra):
    """Windowed blocks (3x3 windows on the 4x4 grid: padded) and relative position bias train under MPP."""
    model = build_mpp(backbone=dict(out_type='raw', **extra)).train()
    assert model.backbone.blocks[0].window_size == extra.get('window_size', 0)
    torch.manual_seed(6)
    inputs = torch.randn(2, 3, 32, 32)
    losses = model.loss(inputs)
    assert all(torch.isfinite(value) for value in losses.values())
    losses['loss'].backward()
    for i, block in enumerate(model.backbone.blocks):
        grads = [param.grad for param in block.parameters()]
        assert all(grad is not None for grad in grads) and any(grad.abs().sum() > 0 for grad in grads), i
        if extra.get('use_rel_pos'):
            assert block.attn.rel_pos_h.grad.abs().sum() > 0, i
    # With every corrupted patch kept as it is, the encoder output is the backbone's own forward.
    model.eval()
    latent, _ = model.encode_corrupted(inputs, sample_corruption(2, 16, mask_prob=0., random_prob=0.))
    with torch.no_grad():
        own = model.backbone(inputs)[0][:, 1:]
    # (The two paths order the same float32 sums differently: a few 1e-6 apart, depending on the weights.)
    torch.testing.assert_close(latent, own, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------------------- configs
@pytest.mark.parametrize('name,target,out', [
    ('vit_b16_mpp_in1k.py', 'mean_color_3bit', (512, )),
    ('vit_b16_mpp_in1k_4x4.py', 'downsized_4x4_3bit', (16, 512)),
    ('vit_b16_mpp_in1k_l2.py', 'pixel_l2', (768, )),
])
def test_configs_build_through_mmpretrain(name, target, out):
    from mmengine.config import Config
    from mmengine.registry import init_default_scope
    from mmpretrain.registry import MODELS
    cfg = Config.fromfile(osp.join(REPO, 'configs', name))
    assert cfg.default_scope == 'mmpretrain'
    assert cfg.optim_wrapper.optimizer.lr == 2e-4 and cfg.global_batch_size == 4096
    assert cfg.param_scheduler[0].end == 10_000 and cfg.param_scheduler[1].type == 'CosineAnnealingLR'
    assert [t.type for t in cfg.train_pipeline][1:3] == ['RandomResizedCrop', 'RandomFlip']
    init_default_scope('mmpretrain')
    model_cfg = copy.deepcopy(cfg.model)
    model_cfg.backbone.arch = TINY_ARCH  # the paper's B/16 layout, shrunk to build quickly
    model_cfg.head.in_channels = TINY_ARCH['embed_dims']
    model = MODELS.build(model_cfg)
    assert type(model).__name__ == 'MaskedPatchPrediction' and model.head.target == target
    assert (model.corrupt_ratio, model.mask_prob, model.random_prob) == (0.5, 0.8, 0.1)
    assert model.backbone.patch_size == (16, 16) and model.backbone.img_size == (224, 224)
    assert model.head(torch.zeros(1, 2, TINY_ARCH['embed_dims'])).shape == (1, 2, *out)


def _backbone_state(state_dict):
    return {k[len('backbone.'):]: v for k, v in state_dict.items() if k.startswith('backbone.')}


def test_finetune_config_loads_mpp_checkpoint(tmp_path):
    """vit_b16_mpp-ft_in1k-384.py takes every backbone weight of an MPP checkpoint; fresh zero head."""
    from mmengine.config import Config
    from mmengine.registry import init_default_scope
    from mmpretrain.registry import MODELS
    from vit_plugin.models.pos_embed import resize_pos_embed
    init_default_scope('mmpretrain')
    pre_cfg = Config.fromfile(osp.join(REPO, 'configs', 'vit_b16_mpp_in1k.py')).model
    pre_cfg.backbone.arch, pre_cfg.head.in_channels = TINY_ARCH, TINY_ARCH['embed_dims']
    mpp = MODELS.build(pre_cfg)
    mpp.init_weights()
    ckpt = tmp_path / 'iter_100000.pth'
    torch.save(dict(meta=dict(iter=100000), state_dict=mpp.state_dict()), ckpt)

    ft_cfg = Config.fromfile(osp.join(REPO, 'configs', 'vit_b16_mpp-ft_in1k-384.py'))
    assert ft_cfg.model.backbone.init_cfg.prefix == 'backbone.'
    ft_cfg.model.backbone.arch, ft_cfg.model.head.in_channels = TINY_ARCH, TINY_ARCH['embed_dims']
    ft_cfg.model.backbone.init_cfg.checkpoint = str(ckpt)
    classifier = MODELS.build(ft_cfg.model)
    classifier.init_weights()

    source, loaded = _backbone_state(mpp.state_dict()), classifier.backbone.state_dict()
    assert set(loaded) == set(source)  # no missing backbone keys, nothing extra
    for key, value in source.items():
        if key in ('pos_embed', 'pos_embed_grid'):
            continue
        assert torch.equal(loaded[key], value), key
    # 224 px -> 384 px: the 14x14 table is resized to 24x24 on load, by the same rule as the supervised
    # fine-tuning of vit_b16_in21k_ft_in1k_384.py: the official loader's resize.
    assert classifier.backbone.pos_embed_load_mode == 'official'
    assert torch.allclose(loaded['pos_embed'], resize_pos_embed(source['pos_embed'], (24, 24), (14, 14), 1,
                                                                 mode='official'), atol=1e-6)
    assert all(float(p.detach().abs().max()) == 0. for p in classifier.head.parameters())


@pytest.mark.slow
def test_mpp_training_run_on_digits_lowers_loss_and_fine_tunes(tmp_path, digits_root):
    """A few hundred real iterations of the project's MPP config, then its fine-tuning config."""
    from mmengine.config import Config
    from mmengine.runner import Runner
    cfg = Config.fromfile(osp.join(PROJECT, 'configs', 'mpp_tiny-vit_digits.py'))
    cfg.model.backbone.arch, cfg.model.head.in_channels = TINY_ARCH, TINY_ARCH['embed_dims']
    iters = 300
    cfg.train_cfg.max_iters = iters
    cfg.param_scheduler[0].end = cfg.param_scheduler[1].begin = 30
    cfg.param_scheduler[1].end = iters
    cfg.train_dataloader.update(batch_size=32, num_workers=0)
    cfg.train_dataloader.dataset.data_root = digits_root
    cfg.default_hooks.checkpoint.interval = iters
    cfg.default_hooks.logger.interval = 50
    cfg.work_dir = str(tmp_path / 'mpp')
    cfg.experiment_name = 'test_mpp_digits'
    runner = Runner.from_cfg(cfg)
    runner.train()
    losses = runner.message_hub.get_scalar('train/loss').data[0]
    assert len(losses) == iters
    first, last = sum(losses[:10]) / 10, sum(losses[-50:]) / 50
    # From ~ln(512) = 6.2 (uniform over the colour classes) to well under ln(8) = 2.1, the loss of
    # knowing only which 8 grey levels occur in the digits.
    assert first > 5.0 and last < 2.0, (first, last)

    ft = Config.fromfile(osp.join(PROJECT, 'configs', 'tiny-vit_digits_ft-mpp.py'))
    ft.model.backbone.arch, ft.model.head.in_channels = TINY_ARCH, TINY_ARCH['embed_dims']
    ckpt = osp.join(cfg.work_dir, f'iter_{iters}.pth')
    ft.model.backbone.init_cfg.checkpoint = ckpt
    from mmpretrain.registry import MODELS
    classifier = MODELS.build(ft.model)
    classifier.init_weights()
    from vit_plugin.checkpoint.safe_load import safe_torch_load
    source = _backbone_state(safe_torch_load(ckpt, map_location='cpu')['state_dict'])
    loaded = classifier.backbone.state_dict()
    assert set(loaded) == set(source)
    assert all(torch.equal(loaded[k], source[k]) for k in source)
