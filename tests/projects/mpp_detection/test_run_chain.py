"""The pre-train -> detect chain on the shapes data: the unlabelled split, the MPP config of the
detector's own backbone, the hand-off of its checkpoint to the detector, the ResNet-18 baseline and
projects/mpp_detection/run_chain.py end to end on a toy budget."""
import glob
import json
import math
import os.path as osp

import cv2
import numpy as np
import pytest
import torch
from mmdet.models.backbones import ResNet
from mmdet.models.necks import FPN
from mmengine.config import Config
from mmengine.registry import init_default_scope

from helpers.common import REPO
import vit_plugin  # noqa: F401  (registers the vit_plugin scope)
from vit_plugin.datasets.shapes_coco import ShapesUnlabelledDataset, make_shapes_coco
from vit_plugin.models.backbones.vit import ViT

CONFIGS = osp.join(REPO, 'configs')
MPP = 'mpp_vit_tiny_shapes.py'
SCRATCH = 'mask_rcnn_vit_tiny_simplefpn_shapes.py'
FT_MPP = 'mask_rcnn_vit_tiny_simplefpn_shapes_ft-mpp.py'
R18 = 'mask_rcnn_r18_fpn_shapes.py'


@pytest.fixture(autouse=True)
def _keep_default_scope():
    """These tests switch mmengine's default scope between mmpretrain and mmdet; later test modules
    build models in whatever scope was current before them."""
    from mmengine.registry import DefaultScope
    before = dict(DefaultScope._instance_dict)
    yield
    DefaultScope._instance_dict.clear()
    DefaultScope._instance_dict.update(before)


def _cfg(name):
    return Config.fromfile(osp.join(CONFIGS, name))


def _build(model_cfg, scope):
    from mmengine.registry import MODELS
    init_default_scope(scope)
    return MODELS.build(model_cfg)


def _images(folder):
    return {osp.basename(p): cv2.imread(p) for p in sorted(glob.glob(osp.join(str(folder), '*.png')))}


# ---------------------------------------------------------------------------------------------- data
def test_unlabelled_split_holds_new_images(tmp_path):
    """The unlabelled split is generated on first use next to the labelled splits, has the requested
    size, carries no labels, and shares no image with train or val."""
    root = str(tmp_path / 'shapes') + '/'
    make_shapes_coco(root, dict(train=24, val=12))  # the detector's splits (seed 0)
    dataset = ShapesUnlabelledDataset(data_root=root, num_images=40, pipeline=[])
    assert len(dataset) == 40
    assert all(osp.isfile(dataset.get_data_info(i)['img_path']) for i in range(40))
    assert 'gt_label' not in dataset.get_data_info(0)
    unlabelled = _images(osp.join(root, 'unlabelled'))
    assert len(unlabelled) == 40
    labelled = list(_images(osp.join(root, 'train')).values()) + list(_images(osp.join(root, 'val')).values())
    for name, img in unlabelled.items():
        assert not any(img.shape == other.shape and np.array_equal(img, other) for other in labelled), name
    # the images are varied (not one image repeated)
    assert len({img.tobytes() for img in unlabelled.values()}) == 40
    # make_shapes_coco seeds a lone split like the train split of the same seed: seed 0 is refused
    with pytest.raises(ValueError, match='seed 0'):
        ShapesUnlabelledDataset(data_root=root, num_images=4, seed=0, pipeline=[])
    with pytest.raises(ValueError, match='labelled split'):
        ShapesUnlabelledDataset(data_root=root, split='val', pipeline=[])


def test_mpp_config_pretrains_exactly_the_detector_backbone(tmp_path):
    """Same backbone arguments as the detector (from the shared base file), head matched to it, and
    the data pipeline gives fixed 160x160 crops of unlabelled images."""
    from mmpretrain.registry import DATASETS
    mpp, detector = _cfg(MPP), _cfg(SCRATCH)
    only_detector = {'out_type', 'out_indices', 'init_cfg'}
    assert {k: v for k, v in detector.model.backbone.items() if k not in only_detector} == mpp.model.backbone
    assert mpp.model.head.in_channels == detector.model.backbone.arch.embed_dims
    assert mpp.model.head.patch_size == detector.model.backbone.patch_size == 8
    assert mpp.model.head.target == 'mean_color_3bit' and mpp.model.corrupt_ratio == 0.5
    assert mpp.train_cfg.type == 'vit_plugin.IterBasedTrainLoop'
    assert mpp.train_dataloader.dataset.seed != detector.train_dataloader.dataset.get('seed', 0)
    init_default_scope('mmpretrain')
    data_cfg = mpp.train_dataloader.dataset
    data_cfg.update(data_root=str(tmp_path / 'shapes') + '/', num_images=3)
    dataset = DATASETS.build(data_cfg)
    assert len(dataset) == 3
    assert all(tuple(dataset[i]['inputs'].shape) == (3, 160, 160) for i in range(3))


# ---------------------------------------------------------------------------------------------- hand-off
def _mpp_checkpoint(path, seed):
    """An MPP model of the config with every tensor moved off its initial value, saved as the Runner
    saves (meta + state_dict); returns its state dict."""
    model = _build(_cfg(MPP).model, 'mmpretrain')
    torch.manual_seed(seed)
    model.init_weights()
    with torch.no_grad():
        for param in model.parameters():  # rel-pos tables start at zero: make every tensor distinctive
            param.add_(torch.randn_like(param))
    state = model.state_dict()
    torch.save(dict(meta=dict(iter=1, seed=seed), state_dict=state), path)
    return state


def _ft_detector(checkpoint):
    cfg = _cfg(FT_MPP)
    cfg.model.backbone.init_cfg.checkpoint = checkpoint
    torch.manual_seed(0)
    detector = _build(cfg.model, 'mmdet')
    detector.init_weights()
    return detector


def test_mpp_checkpoint_initialises_the_detector_backbone_only(tmp_path):
    """Every backbone tensor of the MPP checkpoint arrives unchanged in the detector's ViT (same
    160x160 grid: the position table loads as it is); the [mask] embedding and the MPP head are not
    loaded; the pyramid and heads are fresh: the same whichever checkpoint the backbone came from."""
    path_a, path_b = str(tmp_path / 'mpp_a.pth'), str(tmp_path / 'mpp_b.pth')
    source = _mpp_checkpoint(path_a, seed=1)
    _mpp_checkpoint(path_b, seed=2)
    det_a, det_b = _ft_detector(path_a), _ft_detector(path_b)

    assert type(det_a.backbone) is ViT and det_a.backbone.patch_grid == (20, 20)
    backbone = {k[len('backbone.'):]: v for k, v in source.items() if k.startswith('backbone.')}
    loaded = det_a.backbone.state_dict()
    assert set(loaded) == set(backbone)
    assert sum('.attn.rel_pos_' in k for k in loaded) == 8
    for key, value in backbone.items():
        torch.testing.assert_close(loaded[key], value, rtol=0, atol=0, msg=key)
    # what MPP has besides its backbone stays behind
    others = [k for k in source if not k.startswith(('backbone.', 'data_preprocessor.'))]
    assert 'mask_token' in others and any(k.startswith('head.') for k in others)
    detector_tensors = det_a.state_dict()
    assert not any('mask_token' in k for k in detector_tensors)
    for key in others:
        assert not any(t.shape == source[key].shape and torch.equal(t, source[key])
                       for t in detector_tensors.values()), key
    # the rest of the detector does not depend on the checkpoint's contents
    backbone_b = det_b.backbone.state_dict()
    assert not torch.equal(backbone_b['blocks.0.attn.qkv.weight'], loaded['blocks.0.attn.qkv.weight'])
    head_keys = [k for k in detector_tensors if not k.startswith('backbone.')]
    assert any(k.startswith('roi_head.') for k in head_keys) and any(k.startswith('neck.') for k in head_keys)
    state_b = det_b.state_dict()
    for key in head_keys:
        torch.testing.assert_close(detector_tensors[key], state_b[key], rtol=0, atol=0, msg=key)
    # and the detector runs on a padded, non-square batch (position table resized on the fly)
    with torch.no_grad():
        feats = det_a.eval().extract_feat(torch.randn(1, 3, 96, 224))
    assert feats[1].shape[-2:] == (12, 28)


def test_ft_mpp_config_changes_only_the_backbone_init_and_the_layer_decay():
    ft, scratch = _cfg(FT_MPP).to_dict(), _cfg(SCRATCH).to_dict()
    assert ft['model']['backbone'].pop('init_cfg')['prefix'] == 'backbone.'
    assert scratch['model']['backbone'].pop('init_cfg') is None
    rate = ft['optim_wrapper'].pop('paramwise_cfg')['layer_decay_rate']
    assert 0.5 <= rate < 1.0 and scratch['optim_wrapper'].pop('paramwise_cfg')['layer_decay_rate'] == 1.0
    assert ft == scratch


# ---------------------------------------------------------------------------------------------- baseline
def test_r18_baseline_differs_from_the_vit_detector_in_backbone_neck_and_optimizer_only():
    r18, vit = _cfg(R18), _cfg(SCRATCH)
    for key in ('rpn_head', 'roi_head', 'train_cfg', 'test_cfg', 'data_preprocessor'):
        assert r18.model[key] == vit.model[key], key
    for key in ('train_dataloader', 'val_dataloader', 'val_evaluator', 'train_cfg', 'param_scheduler'):
        assert r18[key] == vit[key], key
    assert r18.train_cfg.max_epochs == 24
    wrapper = r18.optim_wrapper
    assert 'constructor' not in wrapper and 'layer_decay_rate' not in wrapper.get('paramwise_cfg', {})
    assert (wrapper.optimizer.type, wrapper.optimizer.lr, wrapper.optimizer.weight_decay) == ('AdamW', 1e-3, 0.05)
    assert wrapper.optimizer == vit.optim_wrapper.optimizer and wrapper.clip_grad == vit.optim_wrapper.clip_grad

    model = _build(r18.model, 'mmdet')
    model.init_weights()
    assert type(model.backbone) is ResNet and model.backbone.depth == 18
    assert not model.backbone.norm_eval and model.backbone.frozen_stages == -1
    assert all(p.requires_grad for p in model.backbone.parameters())
    assert type(model.neck) is FPN and model.neck.in_channels == [64, 128, 256, 512]
    assert model.neck.out_channels == 64
    with torch.no_grad():
        feats = model.eval().extract_feat(torch.randn(1, 3, 128, 192))
    strides = [s[0] for s in model.rpn_head.prior_generator.strides]
    assert strides == [4, 8, 16, 32, 64] and len(feats) == 5
    for feat, stride in zip(feats, strides):
        assert feat.shape[1:] == (64, math.ceil(128 / stride), math.ceil(192 / stride))

    from mmengine.optim import build_optim_wrapper
    optimizer = build_optim_wrapper(model, r18.optim_wrapper).optimizer
    assert type(optimizer) is torch.optim.AdamW
    decay = {id(p): g['weight_decay'] for g in optimizer.param_groups for p in g['params']}
    assert decay[id(model.backbone.conv1.weight)] == 0.05
    assert decay[id(model.backbone.bn1.weight)] == 0 and decay[id(model.neck.lateral_convs[0].conv.bias)] == 0


# ---------------------------------------------------------------------------------------------- the chain
def _run_chain():
    from projects.mpp_detection import run_chain
    return run_chain


def _strings(obj):
    if isinstance(obj, str):
        yield obj
    elif isinstance(obj, dict):
        for value in obj.values():
            yield from _strings(value)
    elif isinstance(obj, list):
        for value in obj:
            yield from _strings(value)


def test_run_chain_refuses_fine_tuning_without_pretraining():
    with pytest.raises(SystemExit):
        _run_chain().parse_args(['--arms', 'vit-mpp', 'r18'])


@pytest.mark.slow
def test_run_chain_toy_budget_end_to_end(tmp_path):
    """All four arms for one seed on the toy budget: every stage trains, the fine-tuning loads the
    MPP checkpoint it just wrote, COCO evaluation gives finite metrics, results.json holds relative
    paths only."""
    work_dir = tmp_path / 'chain'
    _run_chain().main(['--budget', 'toy', '--seeds', '0', '--work-dir', str(work_dir)])
    with open(work_dir / 'results.json') as f:
        results = json.load(f)
    assert not any(osp.isabs(s) for s in _strings(results))
    assert sorted(results['runs']) == sorted(['mpp', 'vit-mpp', 'vit-scratch', 'r18'])
    mpp = results['runs']['mpp'][0]
    assert mpp['iters'] == 2 and math.isfinite(mpp['loss_final']) and mpp['loss_final'] > 0
    assert osp.isfile(work_dir / mpp['checkpoint'])
    assert results['summary']['mpp']['loss_final']['mean'] == pytest.approx(mpp['loss_final'])
    assert results['runs']['vit-mpp'][0]['checkpoint'] == mpp['checkpoint']
    for arm in ('vit-mpp', 'vit-scratch', 'r18'):
        (run,) = results['runs'][arm]
        assert run['seconds'] > 0 and run['epochs'] == 1
        for metric in ('bbox_mAP', 'bbox_mAP_50', 'segm_mAP', 'segm_mAP_50'):
            assert run[metric] is not None and 0 <= run[metric] <= 1, (arm, metric, run)
            assert results['summary'][arm][metric] == dict(mean=run[metric], std=None, n=1)
    # the detectors trained on the toy splits written under the work dir
    assert len(_images(work_dir / 'data' / 'train')) == 4 and len(_images(work_dir / 'data' / 'unlabelled')) == 8
