"""Which of mmcv's compiled operators (``mmcv._ext``) our detection configs reach: one training step
(loss + backward) and one inference (``predict``) per config on small random images, with every
``mmcv._ext`` function wrapped to record its calls.

    OMP_NUM_THREADS=1 python tools/analysis/mmcv_ops_census.py [--device cuda] [--out census.json]

Configs: every detection config in ``configs/`` (``*rcnn*``, ``retinanet*``), a Cascade Mask R-CNN with our
ViT (mmdet's cascade-mask-rcnn_r50_fpn_1x_coco.py with the backbone and neck of
``mask_rcnn_vit_tiny_simplefpn_shapes.py``) and mmdet's own mask-rcnn_r50_fpn_1x_coco.py. Backbones start
from random weights (no checkpoint is read); the data are mmdet's ``demo_mm_inputs`` (boxes, masks).

Works with vit_plugin's operators or with a compiled mmcv (whichever ``mmcv._ext`` is), on CPU or, with
``--device cuda``, on a GPU (mmdet runs its sigmoid focal loss through mmcv only on CUDA).
"""
import argparse
import glob
import json
import logging
import os.path as osp
import tempfile
from collections import defaultdict

import torch

import vit_plugin  # noqa: F401  (registers our components)
from benchmarks.child_process import CHECKOUT
from vit_plugin.compat.mmcv import import_ext
from vit_plugin.ops import describe, mmcv_ext_names

REPO = CHECKOUT

TINY_VIT = osp.join(REPO, 'configs', '_base_', 'models', 'vit_tiny_shapes.py')
CASCADE = f'''
_base_ = ['mmdet::cascade_rcnn/cascade-mask-rcnn_r50_fpn_1x_coco.py', {TINY_VIT!r}]
custom_imports = dict(imports=['vit_plugin'], allow_failed_imports=False)
model = dict(
    data_preprocessor=dict(mean=[127.5] * 3, std=[127.5] * 3),
    backbone=dict(_delete_=True, **_base_.backbone, out_type='featmap', out_indices=-1, init_cfg=None),
    neck=[dict(type='vit_plugin.SimpleFeaturePyramid', in_channels=_base_.backbone.arch.embed_dims, out_channels=None,
               scale_factors=(2.0, 1.0, 0.5)),
          dict(type='FPN', in_channels=[_base_.backbone.arch.embed_dims // 2, _base_.backbone.arch.embed_dims,
                                        _base_.backbone.arch.embed_dims], out_channels=64, num_outs=5)],
    rpn_head=dict(in_channels=64, feat_channels=64),
    roi_head=dict(bbox_roi_extractor=dict(out_channels=64), mask_roi_extractor=dict(out_channels=64),
                  bbox_head=[dict(head, in_channels=64, num_classes=3) for head in _base_.model.roi_head.bbox_head],
                  mask_head=dict(in_channels=64, num_classes=3)))
'''


def config_files(tmp_dir):
    names = sorted(osp.basename(p) for p in glob.glob(osp.join(REPO, 'configs', '*.py'))
                   if 'rcnn' in osp.basename(p) or osp.basename(p).startswith('retinanet'))
    files = {name[:-3]: osp.join(REPO, 'configs', name) for name in names}
    cascade = osp.join(tmp_dir, 'cascade_mask_rcnn_vit_tiny.py')
    with open(cascade, 'w') as f:
        f.write(CASCADE)
    files['cascade_mask_rcnn_vit_tiny (mmdet cascade-mask-rcnn_r50_fpn_1x_coco + our ViT)'] = cascade
    mmdet_own = osp.join(tmp_dir, 'mask_rcnn_r50.py')
    with open(mmdet_own, 'w') as f:
        f.write("_base_ = 'mmdet::mask_rcnn/mask-rcnn_r50_fpn_1x_coco.py'\n")
    files['mmdet mask-rcnn_r50_fpn_1x_coco'] = mmdet_own
    return files


def build(path):
    from mmengine.config import Config
    from mmengine.registry import init_default_scope

    from mmdet.registry import MODELS
    cfg = Config.fromfile(path)
    backbone = cfg.model.backbone
    backbone.init_cfg = None  # random weights: no checkpoint file or download
    if isinstance(cfg.model.get('init_cfg'), dict):
        cfg.model.init_cfg = None
    # Untrained heads score below the usual 0.05: keep every box, so that post-processing (NMS, mask
    # pasting) runs as it does for a trained model.
    test_cfg = cfg.model.test_cfg
    for part in (test_cfg, test_cfg.get('rcnn')):
        if part is not None and 'score_thr' in part:
            part.score_thr = 0.0
    init_default_scope(cfg.get('default_scope', 'mmdet'))
    model = MODELS.build(cfg.model)
    model.init_weights()
    return model


def instrument(ext, names, calls, phase):
    """Wraps ``ext``'s functions so that each call records (phase, name, device of its first tensor)."""
    originals = {}
    for name in names:
        fn = getattr(ext, name)

        def wrapper(*args, _fn=fn, _name=name, **kwargs):
            device = next((a.device.type for a in list(args) + list(kwargs.values()) if torch.is_tensor(a)), '-')
            calls[(phase[0], _name, device)] += 1
            return _fn(*args, **kwargs)

        originals[name] = fn
        setattr(ext, name, wrapper)
    return originals


def run(model, device, phase):
    from mmdet.testing import demo_mm_inputs
    model = model.to(device)
    num_classes = getattr(getattr(model, 'bbox_head', None), 'num_classes', None) or 3
    packed = demo_mm_inputs(batch_size=2, image_shapes=[(3, 128, 160), (3, 112, 128)], num_items=[3, 2],
                            num_classes=num_classes, with_mask=True, device=device)
    model.train()
    phase[0] = 'train'
    data = model.data_preprocessor(packed, True)
    losses = model(**data, mode='loss')
    loss, _ = model.parse_losses(losses)
    loss.backward()
    model.eval()
    phase[0] = 'inference'
    with torch.no_grad():
        data = model.data_preprocessor(packed, False)
        model(**data, mode='predict')


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--device', default='cpu')
    parser.add_argument('--only', nargs='*', help='substrings of the config names to run')
    parser.add_argument('--out', help='write the census as JSON')
    args = parser.parse_args(argv)
    ext = import_ext()
    from mmengine.logging import MMLogger
    MMLogger.get_current_instance().setLevel(logging.WARNING)  # not the weight-initialisation report
    torch.manual_seed(0)
    calls = defaultdict(int)
    phase = ['build']
    names = [n for n in mmcv_ext_names() if callable(getattr(ext, n, None))]
    originals = instrument(ext, names, calls, phase)
    census = {}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for label, path in config_files(tmp).items():
                if args.only and not any(s in label for s in args.only):
                    continue
                calls.clear()
                phase[0] = 'build'
                run(build(path), args.device, phase)
                census[label] = sorted(f'{p}: {n} ({d})' for (p, n, d) in calls)
                print(f'{label}:')
                for (p, n, d), count in sorted(calls.items()):
                    print(f'  {p:9s} {n} on {d} x{count}')
    finally:
        for name, fn in originals.items():
            setattr(ext, name, fn)
    reached = sorted({entry.split(': ', 1)[1] for entries in census.values() for entry in entries})
    print(f'mmcv._ext: {describe()}')
    print('reached:', ', '.join(reached))
    if args.out:
        with open(args.out, 'w') as f:
            json.dump(dict(ops=describe(), device=args.device, configs=census, reached=reached), f, indent=1)


if __name__ == '__main__':
    main()
