"""Run a trained classifier or detector on images: top-k classes, or detections drawn into PNGs.

    python tools/infer.py CONFIG CHECKPOINT IMAGE_OR_FOLDER [...] [--topk 5] [--batch-size 8]
        [--out results.json] [--out-dir vis/] [--score-thr 0.3] [--device cpu] [--backbone-only]
    python tools/infer.py MODEL_NAME IMAGE_OR_FOLDER [...] [--topk 5] ...

See docs/inference.md.
"""
import argparse
import json
import os
import os.path as osp
from typing import Dict, List

from vit_plugin.checkpoint import CheckpointError, CheckpointMismatchError, is_checkpoint_path
from vit_plugin.datasets import ImageDecodeError
from vit_plugin.inference import CheckedImageClassificationInferencer, build_classification_inferencer
from vit_plugin.models import check_input_normalization
from vit_plugin.zoo import UnknownModelError, get_config, get_model

IMAGE_EXTENSIONS = ('.jpg', '.jpeg', '.png', '.bmp', '.webp', '.tif', '.tiff')


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('config', metavar='CONFIG|MODEL_NAME',
                        help='config file, or the name of a released model (vit_plugin.list_models())')
    parser.add_argument('inputs', nargs='+', metavar='[CHECKPOINT] IMAGE',
                        help='after a config file its CHECKPOINT, then image files and/or folders (searched '
                        'recursively); a model name brings its own weights')
    parser.add_argument('--topk', type=int, default=5, help='classification: classes shown per image')
    parser.add_argument('--batch-size', type=int, default=8)
    parser.add_argument('--score-thr', type=float, default=0.3, help='detection: lowest score drawn and listed')
    parser.add_argument('--out-dir', default='work_dirs/infer', help='detection: where the drawn PNGs go')
    parser.add_argument('--out', help='write the results as JSON here')
    parser.add_argument('--device', default=None, help='e.g. cpu, cuda:0 (default: cuda if available)')
    parser.add_argument('--backbone-only', action='store_true',
                        help='load only the backbone of CHECKPOINT, on purpose: the rest of the model (the head) keeps '
                        'its untrained weights (otherwise a checkpoint that does not fit the config is refused)')
    args = parser.parse_args(argv)
    args.checkpoint = None  # a released model by name: its own weights
    if is_config_file(args.config):
        if len(args.inputs) < 2:
            parser.error(f'{args.config} is a config file: give its CHECKPOINT, then the images')
        args.checkpoint, args.inputs = args.inputs[0], args.inputs[1:]
    return args


def is_config_file(path: str) -> bool:
    """Whether the first argument names a config file (else a released model's name)."""
    return path.endswith('.py') or osp.isfile(path)


def collect_images(inputs: List[str]) -> List[str]:
    """The image files named or found (recursively, sorted) in ``inputs``; SystemExit if none."""
    images = []
    for path in inputs:
        if osp.isdir(path):
            found = sorted(osp.join(root, name) for root, _, names in os.walk(path) for name in names
                           if name.lower().endswith(IMAGE_EXTENSIONS))
            if not found:
                raise SystemExit(f'{path}: no images ({", ".join(IMAGE_EXTENSIONS)}) in this folder.')
            images += found
        elif osp.isfile(path):
            images.append(path)
        else:
            raise SystemExit(f'{path}: no such file or folder.')
    return images


def task_of(cfg) -> str:
    """'detection' for an mmdet model config, 'classification' for an mmpretrain one."""
    scope = cfg.get('default_scope')
    if scope == 'mmdet':
        return 'detection'
    if scope in (None, 'mmpretrain', 'vit_plugin'):
        return 'classification'
    raise SystemExit(f'{cfg.filename}: default_scope={scope!r}; tools/infer.py runs mmpretrain classifiers and '
                     'mmdet detectors.')


def classify(cfg, args, images: List[str]) -> List[Dict]:
    import torch

    if args.checkpoint is None:  # a released model: its weights loaded strictly, as vit_plugin.get_model does
        if cfg.model.head is None:
            raise SystemExit(f'{args.config} is a backbone without classifier; name a classifier of '
                             f"vit_plugin.list_models(task='Image Classification').")
        model = get_model(args.config, pretrained=True, device=args.device, backbone_only=args.backbone_only)
        inferencer = CheckedImageClassificationInferencer(model, pretrained=False, device=args.device)
    else:
        inferencer = build_classification_inferencer(cfg, args.checkpoint, device=args.device,
                                                     backbone_only=args.backbone_only)
    check_input_normalization(inferencer.model)
    classes = inferencer.classes
    results = []
    for path, result in zip(images, inferencer(images, batch_size=args.batch_size)):
        scores = torch.as_tensor(result['pred_scores'])
        top = scores.topk(min(args.topk, scores.numel()))
        entries = [dict(label=int(i), score=float(s), name=str(classes[i]) if classes else str(int(i)))
                   for s, i in zip(top.values.tolist(), top.indices.tolist())]
        results.append(dict(image=path, topk=entries))
        print(f'{path}: ' + ', '.join(f'{e["name"]} {e["score"]:.3f}' for e in entries))
    return results


def detect(cfg, args, images: List[str]) -> List[Dict]:
    import mmcv

    from vit_plugin.inference import CheckedDetInferencer  # defined only where mmdet (the [det] extra) is
    inferencer = CheckedDetInferencer(model=cfg, weights=args.checkpoint, device=args.device, show_progress=True,
                                      backbone_only=args.backbone_only)
    check_input_normalization(inferencer.model)
    classes = inferencer.model.dataset_meta.get('classes') if inferencer.model.dataset_meta else None
    os.makedirs(args.out_dir, exist_ok=True)
    output = inferencer(images, batch_size=args.batch_size, return_vis=True, no_save_vis=True,
                        pred_score_thr=args.score_thr)
    results = []
    for path, pred, vis in zip(images, output['predictions'], output['visualization']):
        keep = [i for i, s in enumerate(pred['scores']) if s >= args.score_thr]
        detections = [dict(label=int(pred['labels'][i]), score=float(pred['scores'][i]),
                           name=str(classes[pred['labels'][i]]) if classes else str(pred['labels'][i]),
                           bbox=[round(float(v), 2) for v in pred['bboxes'][i]]) for i in keep]
        png = osp.join(args.out_dir, osp.splitext(osp.basename(path))[0] + '.png')
        mmcv.imwrite(vis[..., ::-1], png)  # the visualizer draws in RGB; imwrite takes BGR
        results.append(dict(image=path, detections=detections, drawn=png))
        print(f'{path}: {len(detections)} detections >= {args.score_thr} -> {png}')
    return results


def main(argv=None):
    args = parse_args(argv)
    from mmengine.config import Config

    images = collect_images(args.inputs)
    if args.checkpoint is None:
        try:
            cfg = get_config(args.config)
        except UnknownModelError as err:
            raise SystemExit(f'ERROR: {err}') from None
    elif not is_checkpoint_path(args.checkpoint):
        raise SystemExit(f'{args.checkpoint}: no such checkpoint file or folder.')
    else:
        cfg = Config.fromfile(args.config)
    if args.device is None:
        import torch
        args.device = 'cuda' if torch.cuda.is_available() else 'cpu'
    run = detect if task_of(cfg) == 'detection' else classify
    try:
        results = run(cfg, args, images)
    except (CheckpointMismatchError, CheckpointError, ImageDecodeError) as err:  # the message says what and what to do
        raise SystemExit(f'ERROR: {err}') from None
    if args.out:
        with open(args.out, 'w') as f:
            json.dump(results, f, indent=1)
    return results
