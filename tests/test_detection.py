"""ViT as an mmdet detection backbone: windowed attention, the simple feature pyramid, the
layer-decay constructor, the generated shapes dataset, every detection config, checkpoint loading
into the detector, and a real (short) train + COCO evaluation run on CPU."""
import glob
import json
import math
import os
import os.path as osp

import cv2
import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from PIL import Image

from helpers.shapes_detection import (BASELINE_MAP50_MAX, BBOX_MAP50_MIN, CONFIGS, DRAWN_SHARE_MIN, LOSS_RATIO_MAX,
                                      PRECISION_MIN, RECALL_MIN, SEGM_MAP50_MIN, build_detector, demo_cfg,
                                      shapes_training_run)
from vit_plugin.models.backbones.vit import ViT
from vit_plugin.models.layers import window_attention_mask

TINY = dict(embed_dims=48, num_layers=4, num_heads=3, mlp_dims=96)
DETECTION_CONFIGS = ['mask_rcnn_vit_b16_fpn_1x_coco.py', 'faster_rcnn_vit_b16_fpn_1x_coco.py',
                     'retinanet_vit_b16_fpn_1x_coco.py', 'mask_rcnn_vit_b16_simplefpn_1x_coco.py',
                     'mask_rcnn_vit_tiny_simplefpn_shapes.py', 'mask_rcnn_vit_tiny_simplefpn_shapes_ft-mpp.py']


# ---------------------------------------------------------------------------------------------- windows
@pytest.mark.parametrize('with_cls_token', [True, False])
@pytest.mark.parametrize('shape', [(2, 3, 64, 64), (2, 3, 40, 88)])
def test_window_covering_the_grid_equals_global_attention(with_cls_token, shape):
    torch.manual_seed(0)
    common = dict(arch=TINY, img_size=64, patch_size=8, out_type='featmap', with_cls_token=with_cls_token,
                  out_indices=(1, 3))
    glob_model = ViT(**common).eval()
    glob_model.init_weights()
    # window 16 > both grid sides (8x8, 5x11): one (padded, masked) window per image
    win_model = ViT(**common, window_size=16, window_block_indices=(0, 1, 2, 3)).eval()
    win_model.load_state_dict(glob_model.state_dict())
    x = torch.randn(shape)
    for a, b in zip(glob_model(x), win_model(x)):
        torch.testing.assert_close(a, b, atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize('with_cls_token', [True, False])
def test_windowed_attention_matches_dense_masked_attention(with_cls_token):
    """The partitioned (padded) computation equals explicit softmax attention under the window mask."""
    torch.manual_seed(0)
    model = ViT(TINY, img_size=64, patch_size=8, out_type='featmap', with_cls_token=with_cls_token,
                window_size=3, window_block_indices=(0, ))
    model.init_weights()
    tokens, grid = model.embed(torch.randn(2, 3, 56, 80))  # 7x10 grid: windows padded to 9x12
    block = model.blocks[0]
    fast = block(tokens, grid=grid)
    dense, weights = block(tokens, return_attention=True, grid=grid)
    torch.testing.assert_close(fast, dense, atol=2e-5, rtol=1e-5)
    # the windows really restrict attention, and differ from a global block
    allowed = window_attention_mask(grid, 3, int(with_cls_token))
    assert weights.shape[-2:] == allowed.shape
    assert float(weights.detach()[..., ~allowed].abs().max()) == 0
    assert not torch.allclose(fast, model.blocks[1](tokens), atol=1e-3)


def test_window_mask_layout():
    mask = window_attention_mask((3, 4), 2, num_prefix_tokens=1)
    assert mask[0].all() and mask[:, 0].all()  # the class token is global both ways
    patches = mask[1:, 1:]
    # patch (0,0) sees (0,1), (1,0), (1,1) and not (0,2); patch (2,3) sees only (2,2)
    index = lambda r, c: r * 4 + c  # noqa: E731
    assert patches[index(0, 0), [index(0, 1), index(1, 0), index(1, 1)]].all()
    assert not patches[index(0, 0), index(0, 2)]
    assert patches[index(2, 3)].nonzero().flatten().tolist() == [index(2, 2), index(2, 3)]


def test_window_block_selection_and_errors():
    assert ViT(TINY | dict(num_layers=12), window_size=14).window_block_indices == (0, 1, 3, 4, 6, 7, 9, 10)
    large = ViT(dict(embed_dims=32, num_layers=24, num_heads=2, mlp_dims=32), window_size=14)
    assert [i for i in range(24) if i not in large.window_block_indices] == [5, 11, 17, 23]
    assert ViT(TINY).window_block_indices == ()
    assert ViT(TINY, window_size=4, window_block_indices=(-1, 0)).window_block_indices == (0, 3)
    with pytest.raises(ValueError, match='out of range'):
        ViT(TINY, window_size=4, window_block_indices=(4, ))
    with pytest.raises(ValueError, match='window_size'):
        ViT(TINY, window_size=-1)
    model = ViT(TINY, img_size=32, patch_size=8, window_size=2, window_block_indices=(0, ))
    with pytest.raises(ValueError, match='grid'):
        model.blocks[0](torch.randn(1, 17, 48))


def test_windowed_blocks_train_with_activation_checkpointing():
    torch.manual_seed(0)
    model = ViT(TINY, img_size=64, patch_size=8, out_type='featmap', window_size=3, window_block_indices=(0, 2))
    model.init_weights()
    x = torch.randn(2, 3, 48, 72)
    model.train()
    model(x)[0].square().mean().backward()
    expected = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    model.set_grad_checkpointing(True)
    model(x)[0].square().mean().backward()
    for name, param in model.named_parameters():
        torch.testing.assert_close(param.grad, expected[name], atol=1e-6, rtol=1e-5, msg=name)


# ---------------------------------------------------------------------------------------------- neck
def test_layer_norm_2d_normalises_channels():
    from vit_plugin.models.necks import LayerNorm2d
    norm = LayerNorm2d(6, eps=1e-6)
    torch.nn.init.normal_(norm.weight)
    torch.nn.init.normal_(norm.bias)
    x = torch.randn(2, 6, 3, 5)
    ref = F.layer_norm(x.permute(0, 2, 3, 1), (6, ), norm.weight, norm.bias, 1e-6).permute(0, 3, 1, 2)
    torch.testing.assert_close(norm(x), ref)


def test_simple_feature_pyramid_strides_and_modes():
    from vit_plugin.models.necks import SimpleFeaturePyramid
    single = SimpleFeaturePyramid(in_channels=64, out_channels=32, num_outs=5)
    single.init_weights()
    outs = single(torch.randn(2, 64, 6, 10))  # one stride-16 map of a 96x160 input
    assert [tuple(o.shape[1:]) for o in outs] == [(32, 24, 40), (32, 12, 20), (32, 6, 10), (32, 3, 5), (32, 2, 3)]
    # feeding mmdet's FPN: one map per branch, rescale only, ViTDet's widths
    rescale = SimpleFeaturePyramid(in_channels=64, out_channels=None)
    assert rescale.branch_channels == [16, 32, 64, 64]
    maps = [torch.randn(1, 64, 4, 4) for _ in range(4)]
    outs = rescale(maps)
    assert [tuple(o.shape[1:]) for o in outs] == [(16, 16, 16), (32, 8, 8), (64, 4, 4), (64, 2, 2)]
    torch.testing.assert_close(outs[2], maps[2])  # the 1x branch is the identity
    torch.testing.assert_close(outs[3], F.max_pool2d(maps[3], 2))
    with pytest.raises(ValueError, match='scale factors'):
        rescale(maps[:3])
    with pytest.raises(ValueError, match='4.0, 2.0, 1.0 or 0.5'):
        SimpleFeaturePyramid(in_channels=64, scale_factors=(8.0, ))
    # GroupNorm instead of channel LayerNorm: same shapes; each output level normalised per group
    grouped = SimpleFeaturePyramid(in_channels=64, out_channels=32, num_outs=5, norm='GN')
    grouped.init_weights()
    assert not any(isinstance(m, nn.LayerNorm) for m in grouped.modules())
    outs = grouped(torch.randn(2, 64, 6, 10))
    assert [tuple(o.shape[1:]) for o in outs][:4] == [(32, 24, 40), (32, 12, 20), (32, 6, 10), (32, 3, 5)]
    groups = outs[2].reshape(2, 32, -1)  # 32 channels -> 32 groups of one channel
    torch.testing.assert_close(groups.mean(-1), torch.zeros(2, 32), atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="'LN' or 'GN'"):
        SimpleFeaturePyramid(in_channels=64, norm='BN')


@pytest.mark.parametrize('norm', ['LN', 'GN'])
def test_pyramid_maps_are_what_mmcv_roi_align_reads(norm):
    """Compiled mmcv's CPU RoIAlign reads a map's raw memory as NCHW: a map in channels-last memory (same
    values) gives wrong RoI features without any error (torchvision's kernels, which vit_plugin.ops uses
    without compiled mmcv, read values). Every pyramid level must therefore be contiguous, and RoIAlign on
    it must equal RoIAlign on a plain NCHW copy of the same values."""
    from mmcv.ops import roi_align

    from vit_plugin.models.necks import SimpleFeaturePyramid
    from vit_plugin.ops import ops_source
    torch.manual_seed(0)
    x = torch.randn(1, 8, 16, 16)
    channels_last = x.permute(0, 2, 3, 1).contiguous().permute(0, 3, 1, 2)
    rois = torch.tensor([[0, 2., 2., 10., 12.], [0, 0., 0., 15., 15.]])
    # why the neck must care: compiled mmcv silently misreads such a map
    misread = not torch.allclose(roi_align(channels_last, rois, (7, 7), 1.0, 2, 'avg', True),
                                 roi_align(x, rois, (7, 7), 1.0, 2, 'avg', True), atol=1e-3)
    assert misread == (ops_source()['kind'] == 'compiled')
    neck = SimpleFeaturePyramid(in_channels=32, out_channels=8, scale_factors=(2.0, 1.0, 0.5), norm=norm)
    neck.init_weights()
    for level, out in enumerate(neck(torch.randn(1, 32, 8, 8))):
        assert out.is_contiguous(), level
        plain = torch.empty(out.shape).copy_(out)  # NCHW memory, same values
        box = torch.tensor([[0, 0.5, 0.5, out.shape[-1] - 1.5, out.shape[-2] - 1.5]])
        torch.testing.assert_close(roi_align(out, box, (3, 3), 1.0, 2, 'avg', True),
                                   roi_align(plain, box, (3, 3), 1.0, 2, 'avg', True), msg=str(level))


# ---------------------------------------------------------------------------------------------- layer decay
def test_layer_decay_constructor_assigns_lr_per_depth_and_no_decay_names():
    from mmengine.optim import build_optim_wrapper
    model = build_detector(demo_cfg())
    base_lr, rate, wd = 1e-3, 0.5, 0.05
    optim_wrapper = build_optim_wrapper(model, dict(
        type='OptimWrapper', constructor='vit_plugin.LayerDecayOptimWrapperConstructor',
        optimizer=dict(type='AdamW', lr=base_lr, weight_decay=wd), paramwise_cfg=dict(layer_decay_rate=rate)))
    groups = optim_wrapper.optimizer.param_groups
    assert groups[0]['lr'] == base_lr  # the lr mmengine logs is the base (head) lr
    num_layers = model.backbone.num_layers
    seen = set()
    for group in groups:
        for name in group['param_names']:
            if name.startswith('backbone.blocks.'):
                depth = int(name.split('.')[2]) + 1
            elif name in ('backbone.cls_token', 'backbone.pos_embed') or name.startswith('backbone.patch_embed'):
                depth = 0
            else:  # final norm, neck, heads
                depth = num_layers + 1
            assert group['lr'] == pytest.approx(base_lr * rate**(num_layers + 1 - depth)), name
            param = dict(model.named_parameters())[name]
            no_decay = (param.ndim == 1 or name in ('backbone.cls_token', 'backbone.pos_embed')
                        or '.attn.rel_pos_' in name)  # position tables, like pos_embed
            assert group['weight_decay'] == (0 if no_decay else wd), name
            seen.add(name)
    assert seen == {n for n, p in model.named_parameters() if p.requires_grad}
    # an mmpretrain classifier (whose get_layer_depth takes only the name) works the same way
    from mmengine.registry import init_default_scope

    from mmpretrain.registry import MODELS as PRETRAIN_MODELS
    init_default_scope('mmpretrain')
    classifier = PRETRAIN_MODELS.build(dict(type='ImageClassifier', backbone=dict(type='vit_plugin.ViT', arch=TINY),
                                            head=dict(type='LinearClsHead', num_classes=3, in_channels=48)))
    groups = build_optim_wrapper(classifier, dict(
        constructor='vit_plugin.LayerDecayOptimWrapperConstructor', optimizer=dict(type='AdamW', lr=1.0, weight_decay=wd),
        paramwise_cfg=dict(layer_decay_rate=rate))).optimizer.param_groups
    lr_of = {n: g['lr'] for g in groups for n in g['param_names']}
    wd_of = {n: g['weight_decay'] for g in groups for n in g['param_names']}
    assert lr_of['head.fc.weight'] == 1.0 and lr_of['backbone.blocks.3.mlp.fc1.weight'] == rate
    assert lr_of['backbone.pos_embed'] == rate**5 and wd_of['backbone.pos_embed'] == 0
    assert wd_of['backbone.blocks.0.attn.qkv.weight'] == wd
    with pytest.raises(KeyError, match='layer_decay'):
        build_optim_wrapper(model, dict(constructor='vit_plugin.LayerDecayOptimWrapperConstructor',
                                        optimizer=dict(type='AdamW', lr=1e-3), paramwise_cfg=dict(decay_rate=0.5)))


# ---------------------------------------------------------------------------------------------- dataset
def test_shapes_coco_boxes_masks_and_determinism(tmp_path):
    from pycocotools import mask as mask_utils

    from vit_plugin.datasets import SHAPES_CLASSES, make_shapes_coco
    files = make_shapes_coco(str(tmp_path / 'a'), dict(train=6, val=3), seed=3)
    again = make_shapes_coco(str(tmp_path / 'b'), dict(train=6, val=3), seed=3)
    coco = json.load(open(files['train']))
    assert coco == json.load(open(again['train']))
    assert [c['name'] for c in coco['categories']] == list(SHAPES_CLASSES)
    assert len(coco['images']) == 6 and len(coco['annotations']) >= 6
    assert any(im['height'] != im['width'] for im in coco['images'])
    for ann in coco['annotations']:
        image = coco['images'][ann['image_id'] - 1]
        h, w = image['height'], image['width']
        rle = mask_utils.frPyObjects(ann['segmentation'], h, w)
        mask = mask_utils.decode(mask_utils.merge(rle))
        ys, xs = np.nonzero(mask)
        x, y, bw, bh = ann['bbox']
        # the box is tight around the rasterised mask (to rounding of the polygon's edge pixels)
        assert abs(xs.min() - x) <= 1.5 and abs(ys.min() - y) <= 1.5
        assert abs(xs.max() + 1 - (x + bw)) <= 1.5 and abs(ys.max() + 1 - (y + bh)) <= 1.5
        assert mask.sum() == pytest.approx(ann['area'], rel=0.1, abs=15)
        pixels = np.asarray(Image.open(tmp_path / 'a' / 'train' / image['file_name']).convert('RGB'), np.float32)
        assert pixels.shape == (h, w, 3)
        # the object is painted: inside its mask the image is (nearly) one colour, unlike its surroundings
        inner = cv2.erode(mask, np.ones((3, 3), np.uint8)).astype(bool)
        assert pixels[inner].std(0).max() < 12
    with pytest.raises(ValueError, match='size_range'):
        make_shapes_coco(str(tmp_path / 'c'), dict(val=1), size_range=(8, 4))
    with pytest.raises(ValueError, match='colour_mode'):
        make_shapes_coco(str(tmp_path / 'c'), dict(val=1), colour_mode='rainbow')


def _object_colours(root, split_file):
    """Mean RGB inside each (eroded) object mask, with its label."""
    from pycocotools import mask as mask_utils
    coco = json.load(open(split_file))
    out = []
    for ann in coco['annotations']:
        image = coco['images'][ann['image_id'] - 1]
        mask = mask_utils.decode(mask_utils.merge(mask_utils.frPyObjects(ann['segmentation'], image['height'],
                                                                         image['width'])))
        inner = cv2.erode(mask, np.ones((3, 3), np.uint8)).astype(bool)
        pixels = np.asarray(Image.open(osp.join(root, 'train', image['file_name'])).convert('RGB'), np.float32)
        out.append((ann['category_id'] - 1, pixels[inner].mean(0)))
    return out


def test_shapes_colour_modes_and_regeneration(tmp_path):
    from vit_plugin.datasets.shapes_coco import PALETTE, make_shapes_coco
    root = str(tmp_path / 'shapes')
    files = make_shapes_coco(root, dict(train=12), colour_mode='class')
    # 'class': every object is its class's palette colour, jittered by at most 40 per channel
    for label, colour in _object_colours(root, files['train']):
        assert np.abs(colour - np.array(PALETTE[label])).max() <= 41, (label, colour)
    before = os.path.getmtime(files['train'])
    make_shapes_coco(root, dict(train=12), colour_mode='class')  # same arguments: kept as it is
    assert os.path.getmtime(files['train']) == before
    # other arguments: the split is written again, and 'random' colours ignore the palette
    make_shapes_coco(root, dict(train=12), colour_mode='random')
    assert json.load(open(files['train']))['info']['colour_mode'] == 'random'
    off_palette = [np.abs(c - np.array(PALETTE[label])).max() > 41 for label, c in _object_colours(root, files['train'])]
    assert sum(off_palette) > len(off_palette) / 2


# ---------------------------------------------------------------------------------------------- configs
def test_detection_configs_are_all_tested():
    assert sorted(DETECTION_CONFIGS) == sorted(
        osp.basename(p) for p in glob.glob(osp.join(CONFIGS, '*.py'))
        if osp.basename(p).startswith(('mask_rcnn_vit', 'faster_rcnn_vit', 'retinanet_vit')))


@pytest.mark.parametrize('name', DETECTION_CONFIGS)
def test_every_detection_config_builds_and_gives_its_pyramid(name):
    """Each config builds through mmdet's registry (our parts by vit_plugin.X, the rest mmdet's)
    and its backbone + neck turn a padded, non-square batch into the pyramid its heads expect."""
    from mmengine.config import Config

    from vit_plugin.models.necks import SimpleFeaturePyramid
    cfg = Config.fromfile(osp.join(CONFIGS, name))
    assert cfg.default_scope == 'mmdet' and 'vit_plugin' in cfg.custom_imports['imports']
    cfg.model.backbone.init_cfg = None  # the COCO configs point at a checkpoint users download
    model = build_detector(cfg).eval()
    assert type(model.backbone) is ViT
    assert any(isinstance(m, SimpleFeaturePyramid) for m in model.neck.modules())
    if 'rpn_head' in cfg.model:
        strides = [s[0] for s in model.rpn_head.prior_generator.strides]
    else:
        strides = [s[0] for s in model.bbox_head.prior_generator.strides]
    with torch.no_grad():
        feats = model.extract_feat(torch.randn(1, 3, 128, 192))
    assert len(feats) == len(strides)
    for feat, stride in zip(feats, strides):
        assert feat.shape[-2:] == (math.ceil(128 / stride), math.ceil(192 / stride)), (name, stride)


# ---------------------------------------------------------------------------------------------- loading
@pytest.mark.parametrize('use_rel_pos', [False, True])
def test_classification_checkpoint_loads_into_detector_backbone(tmp_path, use_rel_pos):
    """An mmpretrain classifier of ours trained at 224 initialises the detector's backbone: every
    backbone tensor is loaded, the 28x28 position table is resized to the detector's 20x20 grid. With
    ViTDet's relative position bias the tables, absent from the checkpoint, start at zero."""
    from mmengine.registry import init_default_scope

    from mmpretrain.registry import MODELS as PRETRAIN_MODELS
    init_default_scope('mmpretrain')
    classifier = PRETRAIN_MODELS.build(dict(
        type='ImageClassifier',
        backbone=dict(type='vit_plugin.ViT', arch=dict(embed_dims=96, num_layers=4, num_heads=3, mlp_dims=384),
                      patch_size=8, img_size=224),
        head=dict(type='LinearClsHead', num_classes=5, in_channels=96)))
    classifier.init_weights()
    path = str(tmp_path / 'classifier.pth')
    torch.save(dict(state_dict=classifier.state_dict(), meta=dict(epoch=1)), path)

    cfg = demo_cfg(init_cfg=dict(type='Pretrained', checkpoint=path, prefix='backbone.'))
    cfg.model.backbone.use_rel_pos = use_rel_pos
    detector = build_detector(cfg)
    assert detector.backbone.patch_grid == (20, 20)
    detector.init_weights()
    source = classifier.backbone.state_dict()
    loaded = detector.backbone.state_dict()
    tables = {k for k in loaded if '.attn.rel_pos_' in k}
    assert len(tables) == (2 * 4 if use_rel_pos else 0)
    assert set(loaded) - tables == set(source)
    assert all(loaded[k].abs().max() == 0 for k in tables)
    for key, value in source.items():
        if key not in ('pos_embed', 'pos_embed_grid'):
            torch.testing.assert_close(loaded[key], value, rtol=0, atol=0, msg=key)
    # reference: the official (aligned-corners bilinear) resize of the patch part, the default for
    # checkpoints; the class-token entry is kept as it is
    table = source['pos_embed']
    grid = table[:, 1:].reshape(1, 28, 28, 96).permute(0, 3, 1, 2)
    resized = F.interpolate(grid, size=(20, 20), mode='bilinear', align_corners=True)
    expected = torch.cat([table[:, :1], resized.permute(0, 2, 3, 1).reshape(1, 400, 96)], dim=1)
    torch.testing.assert_close(loaded['pos_embed'], expected, atol=1e-5, rtol=1e-5)
    assert loaded['pos_embed_grid'].tolist() == [20, 20]
    # and it runs on a padded, non-square batch (the table is resized again on the fly)
    with torch.no_grad():
        feats = detector.eval().extract_feat(torch.randn(1, 3, 96, 224))
    assert feats[1].shape[-2:] == (12, 28)


# ---------------------------------------------------------------------------------------------- training
@pytest.mark.slow
def test_short_training_on_shapes_learns_and_is_coco_evaluated(tmp_path):
    """Real mmdet training on CPU from scratch: losses finite and falling, COCO bbox and segm evaluation,
    tools/infer.py on the whole validation set, and a detector that works (far above the same model at
    its initial weights).

    Every bar on learned behaviour is a whole-set number with a margin measured over 3 seeds and both
    ATEN_CPU_CAPABILITY=avx2 and =default (tests/shapes_test_margins.py, which prints the table);
    a broken detector (RoI features read at twice their stride) fails every one of them."""
    run = shapes_training_run(tmp_path)
    losses = run['losses']
    assert all(v is not None and math.isfinite(v) for v in losses), losses
    metrics, counts = run['metrics'], run['inference']
    print('shapes after 10 epochs:', {k: round(v, 3) for k, v in metrics.items() if 'mAP' in k}, counts)
    assert run['loss_ratio'] < LOSS_RATIO_MAX, run['loss_ratio']
    assert metrics['coco/bbox_mAP_50'] >= BBOX_MAP50_MIN, metrics
    assert metrics['coco/segm_mAP_50'] >= SEGM_MAP50_MIN, metrics
    assert run['recall'] >= RECALL_MIN and run['precision'] >= PRECISION_MIN, counts
    assert run['drawn_share'] >= DRAWN_SHARE_MIN, counts
    baseline = run['baseline']
    assert baseline['coco/bbox_mAP_50'] < BASELINE_MAP50_MAX and baseline['coco/segm_mAP_50'] < BASELINE_MAP50_MAX, \
        baseline


def test_backbone_and_neck_under_bf16_autocast_match_fp32(tmp_path):
    """The mixed-precision path of our parts (what AmpOptimWrapper's autocast does on an accelerator):
    windowed ViT + simple pyramid under CPU bf16 autocast on a real, padded shapes batch stay finite,
    close to fp32, and give finite gradients to every backbone tensor. (mmcv's CPU NMS / RoIAlign have
    no bf16 kernels, so the heads are left to the fp32 part of this check.)"""
    from mmengine.dataset import pseudo_collate

    from mmdet.registry import DATASETS
    cfg = demo_cfg()
    model = build_detector(cfg)
    model.init_weights()
    cfg.train_dataloader.dataset.update(data_root=str(tmp_path) + '/', num_images=dict(train=2, val=1))
    dataset = DATASETS.build(cfg.train_dataloader.dataset)
    data = model.data_preprocessor(pseudo_collate([dataset[i] for i in range(2)]), training=True)
    inputs = data['inputs']
    assert inputs.shape[-2] % 32 == 0 and inputs.shape[-1] % 32 == 0
    reference = model.extract_feat(inputs)
    with torch.autocast('cpu', dtype=torch.bfloat16):
        feats = model.extract_feat(inputs)
    assert len(feats) == 5
    for low, high in zip(feats, reference):
        assert low.dtype == torch.bfloat16 and torch.isfinite(low).all()
        assert (low.float() - high).abs().mean() < 0.05 * high.abs().mean()
    sum(f.float().square().mean() for f in feats).backward()
    for name, param in model.backbone.named_parameters():
        assert param.grad is not None and torch.isfinite(param.grad).all(), name
    losses = model.loss(inputs, data['data_samples'])  # fp32 end to end, for completeness
    assert all(torch.isfinite(v).all() for k, v in model.parse_losses(losses)[1].items() if 'loss' in k)
