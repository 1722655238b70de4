"""Every classification / pre-training config builds and states the paper's recipe; a pre-training
and a fine-tuning config train for real on tiny data, and fine-tuning starts from the pre-training
checkpoint with a 2D-interpolated position embedding and a fresh zero head."""
import glob
import inspect
import math
import os.path as osp

import numpy as np
import pytest
import torch
from mmengine.config import Config
from mmengine.registry import init_default_scope
from mmengine.runner import Runner
from scipy import ndimage

from helpers.common import REPO
import vit_plugin  # noqa: F401  (registers the vit_plugin scope)
from vit_plugin.engine.global_batch import apply_global_batch_size
from vit_plugin.models import ViT

CONFIGS = osp.join(REPO, 'configs')

# Exact parameter counts of the paper's models (Table 1) as released with the official
# implementation: 224 px, a 1000-class head and no pre-logits layer.
OFFICIAL_PARAMS = {'vit_b16': 86_567_656, 'vit_b32': 88_224_232, 'vit_l16': 304_326_632,
                   'vit_l32': 306_535_400, 'vit_h14': 632_045_800, 'vit_r50_b16': 98_659_112}
# Table 1 of the paper: width D, depth, MLP size.
ARCHS = {'ti': (192, 12, 768), 's': (384, 12, 1536), 'b': (768, 12, 3072), 'l': (1024, 24, 4096),
         'h': (1280, 32, 5120)}
IN21K, PRE_LOGITS = 21843, True


def head_params(dims, num_classes, pre_logits=False):
    """The classifier (and the D x D tanh pre-logits layer of the pre-training head)."""
    return (dims * dims + dims if pre_logits else 0) + dims * num_classes + num_classes


def vit_params(arch, patch, img_size, num_classes=None, pre_logits=False):
    """Parameters of the paper's ViT counted layer by layer: the patch-embedding convolution, the
    class token, the position table (one entry per patch plus the class token), per block two
    LayerNorms, the q/k/v/out projections and the two MLP layers (all with biases), the final
    LayerNorm and the head (none when ``num_classes`` is None). ``arch``: a name of ARCHS or
    (D, depth, MLP size)."""
    dims, depth, mlp = ARCHS[arch] if isinstance(arch, str) else arch
    tokens = (img_size // patch) ** 2 + 1
    block = 2 * 2 * dims + 4 * (dims * dims + dims) + 2 * dims * mlp + mlp + dims
    body = 3 * patch * patch * dims + dims + dims + tokens * dims + depth * block + 2 * dims
    return body + (head_params(dims, num_classes, pre_logits) if num_classes else 0)


def hybrid_params(num_classes, pre_logits):
    """R50+ViT-B/16 at 224 px: the official count with its 1000-class head swapped."""
    return OFFICIAL_PARAMS['vit_r50_b16'] - head_params(768, 1000) + head_params(768, num_classes, pre_logits)


# Every classification / pre-training config (and every base model no top-level config uses).
EXPECTED_PARAMS = {
    'vit_b16_in21k.py': vit_params('b', 16, 224, IN21K, PRE_LOGITS),
    'vit_b32_in21k.py': vit_params('b', 32, 224, IN21K, PRE_LOGITS),
    'vit_l16_in21k.py': vit_params('l', 16, 224, IN21K, PRE_LOGITS),
    'vit_l32_in21k.py': vit_params('l', 32, 224, IN21K, PRE_LOGITS),
    'vit_h14_in21k.py': vit_params('h', 14, 224, IN21K, PRE_LOGITS),
    'vit_r50_b16_in21k.py': hybrid_params(IN21K, PRE_LOGITS),
    # fine-tuning at 384 px: a 24x24 position table and a single zero-initialised linear layer
    'vit_b16_in21k_ft_in1k_384.py': vit_params('b', 16, 384, 1000),
    'vit_l16_in21k_ft_in1k_384.py': vit_params('l', 16, 384, 1000),
    'vit_b16_in21k_ft_cifar10_384.py': vit_params('b', 16, 384, 10),
    'vit_b16_in21k_ft_cifar100_384.py': vit_params('b', 16, 384, 100),
    'vit_b16_in21k_ft_pets_384.py': vit_params('b', 16, 384, 37),
    'vit_b16_in21k_ft_flowers102_384.py': vit_params('b', 16, 384, 102),
    'vit_b16_mpp-ft_in1k-384.py': vit_params('b', 16, 384, 1000),
    # masked patch prediction: the backbone, the learned [mask] embedding (D) and one linear layer to
    # the paper's targets: 512 colours, 16 cells x 512 colours, or the 16x16x3 pixel values
    'vit_b16_mpp_in1k.py': vit_params('b', 16, 224) + 768 + head_params(768, 512),
    'vit_b16_mpp_in1k_4x4.py': vit_params('b', 16, 224) + 768 + head_params(768, 16 * 512),
    'vit_b16_mpp_in1k_l2.py': vit_params('b', 16, 224) + 768 + head_params(768, 16 * 16 * 3),
    # MPP of the shapes detector's ViT (D=96, 4 blocks, MLP 384, 8x8 patches of 160x160 inputs) with its
    # relative position tables (3 heads of 32 channels; 2 x (2 x 5 - 1) rows in the two 5x5-windowed
    # blocks, 2 x (2 x 20 - 1) in the two global ones), the [mask] embedding and the 512-colour layer
    'mpp_vit_tiny_shapes.py': vit_params((96, 4, 384), 8, 160) + 2 * 2 * (9 + 39) * 32 + 96 + head_params(96, 512),
    # the demo: D=128, 4 blocks, MLP 256, 8x8 patches of 32x32 digits, 10 classes
    'vit_demo_digits.py': vit_params((128, 4, 256), 8, 32, 10),
    '_base_/models/vit_ti16.py': vit_params('ti', 16, 224, IN21K, PRE_LOGITS),
    '_base_/models/vit_s16.py': vit_params('s', 16, 224, IN21K, PRE_LOGITS),
}


def _non_detection_configs():
    # Detection configs (mmdet scope, `mmdet::` bases) are built and tested in test_detection_configs.py.
    found = []
    for path in sorted(glob.glob(osp.join(CONFIGS, '*.py'))):
        with open(path) as f:
            if 'mmdet' not in f.read():
                found.append(osp.basename(path))
    return found


CLASSIFICATION_CONFIGS = _non_detection_configs()


def build_model(cfg, device='cpu'):
    """The model of ``cfg`` as the Runner builds it; ``device='meta'``: its structure and parameter
    shapes without weights to fill (ViT-H/14 has 632M), for the tests that count parameters."""
    init_default_scope(cfg.get('default_scope', 'mmpretrain'))
    from mmengine.registry import MODELS
    model_cfg = cfg.model.copy()
    if cfg.get('data_preprocessor') is not None:  # what the Runner does with the top-level entry
        model_cfg.setdefault('data_preprocessor', cfg.data_preprocessor)
    with torch.device(device):
        return MODELS.build(model_cfg)


def _step(pipeline, name):
    return next((t for t in pipeline if t['type'] == name), None)


def test_expected_configs_exist():
    for name in ['vit_l16_in21k.py', 'vit_b16_in21k.py', 'vit_b32_in21k.py', 'vit_l32_in21k.py',
                 'vit_h14_in21k.py', 'vit_r50_b16_in21k.py', 'vit_b16_in21k_ft_in1k_384.py',
                 'vit_l16_in21k_ft_in1k_384.py', 'vit_b16_in21k_ft_cifar10_384.py',
                 'vit_b16_in21k_ft_cifar100_384.py', 'vit_b16_in21k_ft_pets_384.py',
                 'vit_b16_in21k_ft_flowers102_384.py', 'vit_demo_digits.py']:
        assert name in CLASSIFICATION_CONFIGS


def test_layer_by_layer_count_reproduces_the_official_counts():
    for name, arch, patch in [('vit_b16', 'b', 16), ('vit_b32', 'b', 32), ('vit_l16', 'l', 16),
                              ('vit_l32', 'l', 32), ('vit_h14', 'h', 14)]:
        assert vit_params(arch, patch, 224, 1000) == OFFICIAL_PARAMS[name], name


def test_every_config_has_an_expected_parameter_count():
    base_models = ['_base_/models/' + n for n in _base_models_not_built_elsewhere()]
    assert sorted(EXPECTED_PARAMS) == sorted(CLASSIFICATION_CONFIGS + base_models)


@pytest.mark.parametrize('name', CLASSIFICATION_CONFIGS)
def test_config_builds(name):
    cfg = Config.fromfile(osp.join(CONFIGS, name))
    model = build_model(cfg, device='meta')
    assert sum(p.numel() for p in model.parameters()) == EXPECTED_PARAMS[name]
    if cfg.model.type != 'ImageClassifier':
        return
    # The paper's preprocessing: pixels to [-1, 1]; the crop matches the model's resolution.
    pre = cfg.data_preprocessor
    assert list(pre.mean) == [127.5] * 3 and list(pre.std) == [127.5] * 3
    assert cfg.model.head.num_classes == pre.num_classes
    pipeline = cfg.train_dataloader.dataset.pipeline
    crop = _step(pipeline, 'RandomResizedCrop') or _step(pipeline, 'vit_plugin.LoadAndInceptionCrop')
    assert crop is not None and crop['scale'] == cfg.model.backbone.img_size
    assert _step(cfg.test_dataloader.dataset.pipeline if cfg.get('test_dataloader') else [], 'RandomFlip') is None


def _base_models_not_built_elsewhere():
    # Base model files that a top-level config uses are built by test_config_builds already.
    texts = ''.join(open(osp.join(CONFIGS, n)).read() for n in CLASSIFICATION_CONFIGS)
    names = sorted(osp.basename(p) for p in glob.glob(osp.join(CONFIGS, '_base_', 'models', '*.py')))
    return [n for n in names if f'_base_/models/{n}' not in texts]


@pytest.mark.parametrize('name', _base_models_not_built_elsewhere())
def test_base_model_builds(name):
    cfg = Config.fromfile(osp.join(CONFIGS, '_base_', 'models', name))
    cfg.default_scope = 'mmpretrain'
    model = build_model(cfg, device='meta')
    assert sum(p.numel() for p in model.parameters()) == EXPECTED_PARAMS[f'_base_/models/{name}']


@pytest.mark.parametrize('arch', sorted(OFFICIAL_PARAMS))
def test_pretraining_configs_follow_the_paper(arch):
    cfg = Config.fromfile(osp.join(CONFIGS, f'{arch}_in21k.py'))
    assert cfg.model.head.hidden_dim == cfg.model.head.in_channels  # tanh pre-logits of width D
    assert cfg.model.backbone.img_size == 224 and cfg.model.backbone.drop_rate == 0.1
    opt = cfg.optim_wrapper.optimizer
    assert opt.type == 'AdamW' and tuple(opt.betas) == (0.9, 0.999) and opt.weight_decay == 0.03
    assert opt.lr == 1e-3 and cfg.optim_wrapper.clip_grad.max_norm == 1.0
    assert cfg.global_batch_size == 4096
    warmup, decay = cfg.param_scheduler
    assert (warmup.type, warmup.end, decay.type, decay.begin, decay.end_factor) == \
        ('LinearLR', 10000, 'LinearLR', 10000, 0.0)
    flip = _step(cfg.train_dataloader.dataset.pipeline, 'RandomFlip')
    assert flip is not None and flip['direction'] == 'horizontal'


@pytest.mark.parametrize('name,steps,warmup,ema', [('vit_b16_in21k_ft_in1k_384.py', 20000, 500, True),
                                                   ('vit_l16_in21k_ft_in1k_384.py', 20000, 500, True),
                                                   ('vit_b16_in21k_ft_cifar10_384.py', 10000, 500, False),
                                                   ('vit_b16_in21k_ft_cifar100_384.py', 10000, 500, False),
                                                   ('vit_b16_in21k_ft_pets_384.py', 500, 50, False),
                                                   ('vit_b16_in21k_ft_flowers102_384.py', 500, 50, False)])
def test_finetuning_configs_follow_the_paper(name, steps, warmup, ema):
    cfg = Config.fromfile(osp.join(CONFIGS, name))
    opt = cfg.optim_wrapper.optimizer
    assert (opt.type, opt.momentum, opt.weight_decay) == ('SGD', 0.9, 0.0)
    assert cfg.optim_wrapper.clip_grad.max_norm == 1.0 and cfg.global_batch_size == 512
    warmup_sched, cosine = cfg.param_scheduler
    assert (warmup_sched.end, cosine.type, cosine.begin, cosine.end) == \
        (warmup, 'CosineAnnealingLR', warmup, steps)
    assert cfg.train_cfg.max_iters == steps
    assert cfg.model.backbone.img_size == 384 and cfg.model.head.hidden_dim is None
    assert cfg.model.backbone.init_cfg.type == 'Pretrained'
    hooks = [h for h in cfg.get('custom_hooks', []) if h['type'] == 'EMAHook']
    assert bool(hooks) == ema
    if ema:
        assert hooks[0]['momentum'] == pytest.approx(1e-4)  # Polyak factor 0.9999


# ---------------------------------------------------------------- real iterations on tiny data
TINY = dict(embed_dims=32, num_layers=2, num_heads=2, mlp_dims=64)


def _tiny(cfg, work_dir, data_root, img_size, max_steps, name):
    """Test override: the config's recipe and pipelines, a 2-block ViT and 128 digit images."""
    cfg.model.backbone.update(arch=TINY, img_size=img_size, patch_size=8)
    cfg.model.head.update(num_classes=10, in_channels=32)
    if cfg.model.head.get('hidden_dim'):
        cfg.model.head.hidden_dim = 32
    cfg.data_preprocessor.num_classes = 10
    pipeline = []
    for step in cfg.train_dataloader.dataset.pipeline:
        step = dict(step)
        if step['type'] in ('RandomResizedCrop', 'vit_plugin.LoadAndInceptionCrop'):
            step['scale'] = img_size
        pipeline.append(step)
    # CIFAR pipelines start from in-memory arrays
    if pipeline[0]['type'] not in ('LoadImageFromFile', 'vit_plugin.LoadAndInceptionCrop'):
        pipeline.insert(0, dict(type='LoadImageFromFile'))
    cfg.train_dataloader = dict(
        batch_size=16, num_workers=0, sampler=dict(type='InfiniteSampler', shuffle=True, seed=0),
        dataset=dict(type='vit_plugin.DigitsDataset', data_root=data_root, split='train', indices=128,
                     pipeline=pipeline))
    cfg.val_dataloader = cfg.val_evaluator = cfg.val_cfg = None
    cfg.test_dataloader = cfg.test_evaluator = cfg.test_cfg = None
    cfg.custom_hooks = [h for h in cfg.get('custom_hooks', []) if h['type'] != 'EMAHook']
    cfg.global_batch_size = 32  # 2 accumulated micro-batches of 16 per optimizer step
    warmup, decay = cfg.param_scheduler
    warmup.end, decay.begin, decay.end = 3, 3, max_steps
    cfg.optim_wrapper.optimizer.lr = 3e-3 if cfg.optim_wrapper.optimizer.type == 'AdamW' else 0.1
    cfg.train_cfg = dict(type='IterBasedTrainLoop', max_iters=max_steps)
    cfg.default_hooks.checkpoint = dict(type='CheckpointHook', by_epoch=False, interval=max_steps)
    cfg.default_hooks.logger = dict(type='LoggerHook', interval=1)
    cfg.work_dir = str(work_dir)
    cfg.experiment_name = name
    cfg.env_cfg.mp_cfg = dict(mp_start_method='fork', opencv_num_threads=1)
    assert apply_global_batch_size(cfg, world_size=1) == 2
    return cfg


def _losses(runner):
    return np.array(runner.message_hub.get_scalar('train/loss').data[0])


@pytest.mark.slow
def test_pretrain_then_finetune_on_tiny_data(tmp_path, digits_root):
    pre_cfg = _tiny(Config.fromfile(osp.join(CONFIGS, 'vit_b16_in21k.py')), tmp_path / 'pre', digits_root,
                    img_size=32, max_steps=40, name='tiny_pretrain')
    runner = Runner.from_cfg(pre_cfg)
    runner.train()
    losses = _losses(runner)
    assert len(losses) == 80  # 40 optimizer steps x 2 micro-batches
    assert losses[-20:].mean() < losses[:20].mean() - 0.2
    ckpt_path = str(tmp_path / 'pre' / 'iter_80.pth')
    assert osp.isfile(ckpt_path)

    ft_cfg = _tiny(Config.fromfile(osp.join(CONFIGS, 'vit_b16_in21k_ft_cifar10_384.py')), tmp_path / 'ft',
                   digits_root, img_size=64, max_steps=15, name='tiny_finetune')
    ft_cfg.model.backbone.init_cfg.checkpoint = ckpt_path

    # Loading alone, as the runner does it: the backbone comes from the checkpoint with its 4x4
    # position grid interpolated to 8x8 the way the official loader does (scipy.ndimage.zoom,
    # order 1, as the independent reference), the pre-logits layer is gone and the head is zero.
    model = build_model(ft_cfg)
    model.init_weights()
    state = torch.load(ckpt_path, map_location='cpu', weights_only=False)['state_dict']
    old = state['backbone.pos_embed'][0].numpy()
    grid = old[1:].reshape(4, 4, 32)
    expected = np.concatenate([old[:1], ndimage.zoom(grid, (2, 2, 1), order=1).reshape(64, 32)])
    np.testing.assert_allclose(model.backbone.pos_embed[0].detach().numpy(), expected, atol=1e-5)
    torch.testing.assert_close(model.backbone.blocks[1].mlp.fc2.weight, state['backbone.blocks.1.mlp.fc2.weight'])
    assert 'backbone.head.layers.pre_logits.weight' not in dict(model.named_parameters())
    assert not hasattr(model.head.layers, 'pre_logits')
    assert model.head.layers.head.weight.abs().max() == 0 and model.head.layers.head.bias.abs().max() == 0

    runner = Runner.from_cfg(ft_cfg)
    runner.train()
    losses = _losses(runner)
    # A zero head gives uniform predictions: the very first loss is exactly ln(10).
    assert losses[0] == pytest.approx(math.log(10), abs=1e-5)
    assert losses[-6:].mean() < losses[:6].mean() - 0.1
    assert tuple(runner.model.backbone.pos_embed.shape) == (1, 65, 32)


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
    default = inspect.signature(ViT).parameters['pos_embed_load_mode'].default
    assert default == 'official'
    paths = sorted(glob.glob(osp.join(REPO, 'configs', '*.py'))
                   + glob.glob(osp.join(REPO, 'projects', 'masked_patch_prediction', 'configs', '*.py')))
    checked = []
    for path in paths:
        cfg = Config.fromfile(path)
        for backbone in _backbone_cfgs(cfg.get('model', {})):
            assert backbone.get('pos_embed_load_mode', default) == 'official', path
            checked.append(osp.basename(path))
    assert {'vit_b16_in21k_ft_cifar10_384.py', 'vit_b16_mpp-ft_in1k-384.py', 'tiny-vit_digits_ft-mpp.py',
            'mask_rcnn_vit_b16_simplefpn_1x_coco.py'} <= set(checked)
