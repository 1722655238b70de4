"""The detection configs: every one is tested, builds through mmdet's registry and gives its pyramid,
a classification checkpoint initialises the detector's backbone, and a real (short) train + COCO
evaluation run of the shapes config on CPU learns."""
import glob
import math
import os.path as osp

import pytest
import torch
import torch.nn.functional as F

from helpers.shapes_detection import (BASELINE_MAP50_MAX, BBOX_MAP50_MIN, CONFIGS, DRAWN_SHARE_MIN, EPOCHS,
                                      LOSS_RATIO_MAX, PRECISION_MIN, RECALL_MIN, SEGM_MAP50_MIN, build_detector,
                                      demo_cfg, shapes_training_run)
from vit_plugin.models.backbones.vit import ViT


DETECTION_CONFIGS = ['mask_rcnn_vit_b16_fpn_1x_coco.py', 'faster_rcnn_vit_b16_fpn_1x_coco.py',
                     'retinanet_vit_b16_fpn_1x_coco.py', 'mask_rcnn_vit_b16_simplefpn_1x_coco.py',
                     'mask_rcnn_vit_tiny_simplefpn_shapes.py', 'mask_rcnn_vit_tiny_simplefpn_shapes_ft-mpp.py']


# ---------------------------------------------------------------------------------------------- configs
def test_detection_configs_are_all_tested():
    assert sorted(DETECTION_CONFIGS) == sorted(
        osp.basename(p) for p in glob.glob(osp.join(CONFIGS, '*.py'))
        if osp.basename(p).startswith(('mask_rcnn_vit', 'faster_rcnn_vit', 'retinanet_vit')))


@pytest.mark.parametrize('name', DETECTION_CONFIGS)
def test_every_detection_config_builds_and_gives_its_pyramid(name):
    """Each config builds through mmdet's registry (our parts by vit_plugin.X, the rest mmdet's)
    and its backbone + neck turn a padded, non-square batch into the pyramid its heads expect.

    The ViT-B COCO configs are built and run on the meta device: shapes without 86M weights to fill
    (the test checks shapes; the tiny shapes configs run on the CPU here and train below)."""
    from mmengine.config import Config

    from vit_plugin.models.necks import SimpleFeaturePyramid
    cfg = Config.fromfile(osp.join(CONFIGS, name))
    assert cfg.default_scope == 'mmdet' and 'vit_plugin' in cfg.custom_imports['imports']
    cfg.model.backbone.init_cfg = None  # the COCO configs point at a checkpoint users download
    device = torch.device('meta' if name.endswith('_coco.py') else 'cpu')
    with device:
        model = build_detector(cfg).eval()
    assert type(model.backbone) is ViT
    assert any(isinstance(m, SimpleFeaturePyramid) for m in model.neck.modules())
    if 'rpn_head' in cfg.model:
        strides = [s[0] for s in model.rpn_head.prior_generator.strides]
    else:
        strides = [s[0] for s in model.bbox_head.prior_generator.strides]
    with torch.no_grad():
        feats = model.extract_feat(torch.randn(1, 3, 128, 192, device=device))
    assert len(feats) == len(strides) and all(feat.device == device for feat in feats)
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
@pytest.fixture(scope='module')
def shapes_run(tmp_path_factory):
    """Real mmdet training on CPU from scratch: losses, COCO bbox and segm evaluation, tools/infer.py on the
    whole validation set, and the same model at its initial weights evaluated too; one run, shared by the
    tests below, each of which checks one claim.

    Every bar on learned behaviour is a whole-set number with a margin measured over 3 seeds and both
    ATEN_CPU_CAPABILITY=avx2 and =default (tests/helpers/shapes_test_margins.py, which prints the table);
    a broken detector (RoI features read at twice their stride) fails every one of them but the loss
    ratio's, which asks only that the loss falls."""
    run = shapes_training_run(tmp_path_factory.mktemp('shapes'))
    for name, metrics in (('untrained', run['baseline']), (f'after {EPOCHS} epochs', run['metrics'])):
        print(f'shapes, {name}:', {k: round(v, 3) for k, v in metrics.items() if 'mAP' in k})
    print('tools/infer.py on the validation set:', run['inference'])
    return run


@pytest.mark.slow
def test_short_training_on_shapes_has_finite_losses(shapes_run):
    losses = shapes_run['losses']
    assert all(v is not None and math.isfinite(v) for v in losses), losses


@pytest.mark.slow
def test_short_training_on_shapes_lowers_the_loss(shapes_run):
    assert shapes_run['loss_ratio'] < LOSS_RATIO_MAX, shapes_run['loss_ratio']


@pytest.mark.slow
def test_short_training_on_shapes_reaches_the_coco_bbox_bar(shapes_run):
    metrics = shapes_run['metrics']
    assert metrics['coco/bbox_mAP_50'] >= BBOX_MAP50_MIN, metrics


@pytest.mark.slow
def test_short_training_on_shapes_reaches_the_coco_segm_bar(shapes_run):
    metrics = shapes_run['metrics']
    assert metrics['coco/segm_mAP_50'] >= SEGM_MAP50_MIN, metrics


@pytest.mark.slow
def test_short_training_on_shapes_infers_with_recall_and_precision(shapes_run):
    counts = shapes_run['inference']
    assert shapes_run['recall'] >= RECALL_MIN and shapes_run['precision'] >= PRECISION_MIN, counts


@pytest.mark.slow
def test_short_training_on_shapes_draws_detections_on_the_images(shapes_run):
    counts = shapes_run['inference']
    assert shapes_run['drawn_share'] >= DRAWN_SHARE_MIN, counts


@pytest.mark.slow
def test_short_training_on_shapes_beats_the_initial_weights(shapes_run):
    baseline = shapes_run['baseline']
    assert baseline['coco/bbox_mAP_50'] < BASELINE_MAP50_MAX and baseline['coco/segm_mAP_50'] < BASELINE_MAP50_MAX, \
        baseline
