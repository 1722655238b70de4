"""The generated shapes COCO dataset: boxes, masks, determinism, colour modes and regeneration."""
import json
import os
import os.path as osp

import cv2
import numpy as np
import pytest
from PIL import Image


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
