"""A small generated detection / instance-segmentation dataset in COCO format ("shapes").

Circles, squares and triangles of random size and rotation on varied backgrounds (flat, gradient,
blotchy noise, stripes), written as PNG images plus COCO ``instances`` json files with boxes and
polygon masks. By default every class has its own hue (jittered per object), so that colour as well
as outline identifies it; ``colour_mode='random'`` paints objects in any colour that contrasts with
their surroundings, so that only the outline does. The random-colour variant is much harder for a
ViT trained from scratch: with no convolutional prior its linear patch embedding sees a colour
change, not an edge, and a tiny ViT learns little in a CPU-sized budget (see docs/detection.md, shapes
results). Objects never overlap, so every polygon is exactly its visible mask. It exists so that
the whole mmdet train / eval loop, COCO mAP included, can run on a CPU in seconds with no download:
the tests and the detection demo config use it.
"""
import json
import math
import os
import os.path as osp
from typing import Dict, Optional, Sequence, Tuple

import cv2
import numpy as np
from mmdet.datasets import CocoDataset
from mmpretrain.datasets import CustomDataset

from vit_plugin.registry import DATASETS

CLASSES = ('circle', 'square', 'triangle')
PALETTE = [(220, 20, 60), (0, 128, 255), (60, 179, 113)]


def _background(rng: np.random.Generator, h: int, w: int) -> np.ndarray:
    kind = rng.integers(4)
    c1, c2 = rng.integers(0, 256, 3), rng.integers(0, 256, 3)
    if kind == 0:  # flat colour
        img = np.broadcast_to(c1, (h, w, 3)).astype(np.float32)
    elif kind == 1:  # linear gradient in a random direction
        angle = rng.uniform(0, 2 * math.pi)
        yy, xx = np.mgrid[0:h, 0:w]
        t = xx * math.cos(angle) + yy * math.sin(angle)
        t = ((t - t.min()) / max(np.ptp(t), 1e-6))[..., None]
        img = (1 - t) * c1 + t * c2
    elif kind == 2:  # blotchy low-frequency noise
        coarse = rng.uniform(0, 255, (rng.integers(3, 7), rng.integers(3, 7), 3)).astype(np.float32)
        img = cv2.resize(coarse, (w, h), interpolation=cv2.INTER_CUBIC)
    else:  # stripes
        period = rng.integers(6, 20)
        stripes = ((np.arange(w) // period) % 2)[None, :, None] if rng.random() < .5 else \
            ((np.arange(h) // period) % 2)[:, None, None]
        img = np.where(stripes, c1, c2) * np.ones((h, w, 1))
    img = img + rng.normal(0, 6, (h, w, 3))
    return np.clip(img, 0, 255).astype(np.uint8)


def _polygon(rng: np.random.Generator, label: int, cx: float, cy: float, radius: float) -> np.ndarray:
    """Vertices (K, 2) of a shape of class ``label`` centred at (cx, cy) within ``radius``."""
    if label == 0:
        angles = np.linspace(0, 2 * math.pi, 32, endpoint=False)
    else:
        count = 4 if label == 1 else 3
        angles = rng.uniform(0, 2 * math.pi) + np.arange(count) * 2 * math.pi / count
    return np.stack([cx + radius * np.cos(angles), cy + radius * np.sin(angles)], axis=1)


def _contrasting_colour(rng: np.random.Generator, background: np.ndarray) -> np.ndarray:
    mean = background.reshape(-1, 3).mean(0)
    for _ in range(50):
        colour = rng.integers(0, 256, 3)
        if np.abs(colour - mean).sum() > 180:
            return colour
    return 255 - mean.astype(np.int64)


def _class_colour(rng: np.random.Generator, label: int) -> np.ndarray:
    """The class's palette colour, each channel jittered by up to +-40."""
    return np.clip(np.array(PALETTE[label]) + rng.integers(-40, 41, 3), 0, 255)


def _make_image(rng, image_id: int, size_range: Tuple[int, int], max_objects: int, colour_mode: str):
    h, w = (int(rng.integers(size_range[0], size_range[1] + 1)) for _ in range(2))
    img = _background(rng, h, w)
    boxes, annotations = [], []
    for _ in range(int(rng.integers(1, max_objects + 1))):
        for _attempt in range(30):  # rejection sampling: objects must not overlap
            radius = rng.uniform(0.12, 0.3) * min(h, w)
            cx, cy = rng.uniform(radius, w - radius), rng.uniform(radius, h - radius)
            label = int(rng.integers(len(CLASSES)))
            poly = _polygon(rng, label, cx, cy, radius)
            x0, y0 = poly.min(0)
            x1, y1 = poly.max(0)
            if all(x0 > b[2] + 2 or x1 < b[0] - 2 or y0 > b[3] + 2 or y1 < b[1] - 2 for b in boxes):
                break
        else:
            continue
        region = img[max(int(y0), 0):int(y1) + 1, max(int(x0), 0):int(x1) + 1]
        colour = _contrasting_colour(rng, region) if colour_mode == 'random' else _class_colour(rng, label)
        cv2.fillPoly(img, [np.round(poly * 16).astype(np.int32)], colour.tolist(), lineType=cv2.LINE_AA, shift=4)
        boxes.append((x0, y0, x1, y1))
        area = 0.5 * abs(np.dot(poly[:, 0], np.roll(poly[:, 1], 1)) - np.dot(poly[:, 1], np.roll(poly[:, 0], 1)))
        annotations.append(dict(category_id=label + 1, bbox=[float(x0), float(y0), float(x1 - x0), float(y1 - y0)],
                                segmentation=[poly.flatten().round(2).tolist()], area=float(area), iscrowd=0,
                                image_id=image_id))
    return img, annotations


def make_shapes_coco(out_dir: str,
                     num_images: Optional[Dict[str, int]] = None,
                     size_range: Sequence[int] = (96, 160),
                     max_objects: int = 4,
                     seed: int = 0,
                     colour_mode: str = 'class') -> Dict[str, str]:
    """Write the shapes dataset in COCO layout and return the annotation file of each split.

    Layout: ``out_dir/{split}/{id:06d}.png`` and ``out_dir/annotations/instances_{split}.json``.
    Generation is deterministic for the given arguments. A split already on disk is kept if it was
    generated with the same arguments (recorded in the json's ``info``) and written again otherwise.

    Args:
        out_dir (str): Root directory (created if needed).
        num_images (dict[str, int], optional): Images per split. Defaults to None, meaning
            ``{'train': 128, 'val': 32}``.
        size_range (Sequence[int]): Min and max image side; height and width are drawn independently,
            so images are non-square. Defaults to (96, 160).
        max_objects (int): At most this many objects per image (at least one). Defaults to 4.
        seed (int): Random seed. Defaults to 0.
        colour_mode (str): 'class' (each class its own jittered hue) or 'random' (any contrasting
            colour). Defaults to 'class'.

    Returns:
        dict[str, str]: split -> path of its annotation json.
    """
    num_images = dict(train=128, val=32) if num_images is None else dict(num_images)
    if len(size_range) != 2 or not 32 <= size_range[0] <= size_range[1]:
        raise ValueError(f'size_range must be (min_side, max_side) with 32 <= min <= max, got {size_range}')
    if colour_mode not in ('class', 'random'):
        raise ValueError(f"colour_mode must be 'class' or 'random', got {colour_mode!r}")
    os.makedirs(osp.join(out_dir, 'annotations'), exist_ok=True)
    ann_files = {}
    for split_index, (split, count) in enumerate(sorted(num_images.items())):
        ann_file = osp.join(out_dir, 'annotations', f'instances_{split}.json')
        ann_files[split] = ann_file
        info = dict(description='vit_plugin generated shapes', version=2, num_images=count,
                    size_range=list(size_range), max_objects=max_objects, seed=seed, colour_mode=colour_mode)
        if osp.exists(ann_file):
            with open(ann_file) as f:
                if json.load(f).get('info') == info:
                    continue
        rng = np.random.default_rng([seed, split_index])
        os.makedirs(osp.join(out_dir, split), exist_ok=True)
        images, annotations = [], []
        for image_id in range(1, count + 1):
            img, anns = _make_image(rng, image_id, tuple(size_range), max_objects, colour_mode)
            file_name = f'{image_id:06d}.png'
            cv2.imwrite(osp.join(out_dir, split, file_name), img[..., ::-1])  # RGB -> BGR for cv2
            images.append(dict(id=image_id, file_name=file_name, height=img.shape[0], width=img.shape[1]))
            for ann in anns:
                ann['id'] = len(annotations) + 1
                annotations.append(ann)
        coco = dict(info=info, images=images, annotations=annotations,
                    categories=[dict(id=i + 1, name=name, supercategory='shape') for i, name in enumerate(CLASSES)])
        tmp = ann_file + f'.tmp{os.getpid()}'
        with open(tmp, 'w') as f:
            json.dump(coco, f)
        os.replace(tmp, ann_file)  # atomic: concurrent writers (several ranks) never leave a partial file
    return ann_files


@DATASETS.register_module()
class ShapesCocoDataset(CocoDataset):
    """mmdet's COCO dataset on the generated shapes data, written on first use if it is missing.

    Args:
        data_root (str): Where the data lives (or is written).
        ann_file (str): Annotation file relative to ``data_root``, e.g.
            ``'annotations/instances_train.json'``; its split name (``train``/``val``) selects what
            is generated.
        num_images (dict[str, int], optional): Images per split when generating. Defaults to None
            (see :func:`make_shapes_coco`).
        seed (int): Generation seed. Defaults to 0.
        colour_mode (str): 'class' or 'random', see :func:`make_shapes_coco`. Defaults to 'class'.
        **kwargs: Everything else mmdet's ``CocoDataset`` takes (pipeline, data_prefix, ...).
    """
    METAINFO = dict(classes=CLASSES, palette=PALETTE)

    def __init__(self, data_root: str, ann_file: str, num_images: Optional[Dict[str, int]] = None,
                 seed: int = 0, colour_mode: str = 'class', **kwargs):
        if num_images is not None or not osp.isfile(osp.join(data_root, ann_file)):
            # (re)generates only what is missing or was made with other arguments
            make_shapes_coco(data_root, num_images, seed=seed, colour_mode=colour_mode)
            if not osp.isfile(osp.join(data_root, ann_file)):
                raise FileNotFoundError(f'{osp.join(data_root, ann_file)} was not generated: ann_file must be '
                                        f'annotations/instances_<split>.json with <split> a key of num_images')
        super().__init__(data_root=data_root, ann_file=ann_file, **kwargs)


@DATASETS.register_module()
class ShapesUnlabelledDataset(CustomDataset):
    """Shapes images without labels, for self-supervised pre-training; written on first use.

    mmpretrain's ``CustomDataset`` (``with_label=False``) over ``data_root/<split>/*.png``, where
    ``<split>`` is generated by :func:`make_shapes_coco` (its annotation json is written too and
    ignored). :func:`make_shapes_coco` seeds a split with ``(seed, index of the split among the
    requested ones)``, so a lone split generated with seed ``s`` draws the same images as the
    ``train`` split of labelled data generated with seed ``s``. The default seed therefore differs
    from the labelled data's (``ShapesCocoDataset`` defaults to 0), and a seed equal to that of a
    labelled split already in ``data_root`` is refused, so that no labelled (val) image can leak
    into pre-training.

    Args:
        data_root (str): Root shared with the labelled splits, e.g. ``'data/shapes_coco/'``.
        split (str): Folder name of the unlabelled images. Defaults to 'unlabelled'.
        num_images (int): How many images to generate. Defaults to 1024.
        seed (int): Generation seed. Defaults to 1.
        colour_mode (str): 'class' or 'random', see :func:`make_shapes_coco`. Defaults to 'class'.
        **kwargs: Other arguments of mmpretrain's ``CustomDataset`` (``pipeline``...).
    """

    def __init__(self, data_root: str, split: str = 'unlabelled', num_images: int = 1024, seed: int = 1,
                 colour_mode: str = 'class', **kwargs):
        if split in ('train', 'val'):
            raise ValueError(f"split {split!r} is a labelled split name; use another (e.g. 'unlabelled')")
        for labelled in ('train', 'val'):
            ann_file = osp.join(data_root, 'annotations', f'instances_{labelled}.json')
            if osp.isfile(ann_file):
                with open(ann_file) as f:
                    labelled_seed = json.load(f).get('info', {}).get('seed')
                if labelled_seed == seed:
                    raise ValueError(f'seed {seed} is the seed of the labelled {labelled!r} split in {data_root}: '
                                     f'its images would repeat labelled ones; choose another seed')
        make_shapes_coco(data_root, {split: num_images}, seed=seed, colour_mode=colour_mode)
        super().__init__(data_root=data_root, data_prefix=split, with_label=False, **kwargs)


if __name__ == '__main__':
    import argparse

    parser = argparse.ArgumentParser(description='Write the generated shapes dataset in COCO format.')
    parser.add_argument('out_dir')
    parser.add_argument('--train', type=int, default=128, help='training images')
    parser.add_argument('--val', type=int, default=32, help='validation images')
    parser.add_argument('--seed', type=int, default=0)
    parser.add_argument('--colour-mode', default='class', choices=['class', 'random'])
    args = parser.parse_args()
    print(make_shapes_coco(args.out_dir, dict(train=args.train, val=args.val), seed=args.seed,
                           colour_mode=args.colour_mode))
