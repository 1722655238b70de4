"""vit_plugin.LoadAndInceptionCrop: crop statistics, pixels against the reference decode, the packed
output, the registry and the configs, and one box draw per image on broken and unusual files (the boxes
and pixels of a seeded sequence equal mmpretrain's ``RandomResizedCrop``, a header mismatch included)."""
import logging
import math
import os.path as osp

import cv2
import numpy as np
import pytest
import torch
from mmengine.config import Config
from mmengine.logging import MMLogger
from mmengine.dataset import Compose
from mmengine.registry import init_default_scope
from mmpretrain.datasets.transforms import RandomResizedCrop
from mmpretrain.registry import TRANSFORMS
from PIL import Image
from scipy import stats
from sklearn.datasets import load_sample_images

import vit_plugin.datasets.decode as decode
import vit_plugin.datasets.transforms as transforms
from helpers.common import REPO, read_bytes
from vit_plugin.datasets.transforms import LoadAndInceptionCrop, dct_factor, inception_crop_box, jpeg_header

PAPER_RANGE = (0.05, 1.0)
RATIO_RANGE = (3 / 4, 4 / 3)


@pytest.fixture(scope='module', autouse=True)
def mmpretrain_scope():
    init_default_scope('mmpretrain')


@pytest.fixture(scope='module')
def files(tmp_path_factory):
    """A 640x427 photo as a JPEG (baseline, progressive, grayscale) and a PNG, and a 637x427 cut of it
    (no side a multiple of 2 or 4) with each EXIF orientation (``orient1.jpg`` ... ``orient8.jpg``)."""
    folder = tmp_path_factory.mktemp('images')
    photo = Image.fromarray(load_sample_images().images[0])  # RGB, 427x640
    paths = {}

    def save(name, image, **kwargs):
        paths[name] = str(folder / name)
        image.save(paths[name], **kwargs)

    save('plain.jpg', photo, quality=90)
    save('progressive.jpg', photo, quality=90, progressive=True)
    save('gray.jpg', photo.convert('L'), quality=90)
    save('photo.png', photo)
    cut = photo.crop((0, 0, 637, 427))
    for orientation in range(1, 9):  # 6: rotate 90 degrees clockwise on display, etc.
        exif = Image.Exif()
        exif[0x0112] = orientation
        save(f'orient{orientation}.jpg', cut, quality=90, exif=exif.tobytes())
    return paths


# ------------------------------------------------------------------------------------ the crop box
@pytest.mark.parametrize('height,width', [(427, 640), (640, 427), (300, 1200), (1200, 300), (40, 40)])
def test_box_equals_mmpretrain_for_the_same_seed(height, width):
    # Same draws in the same order: a seeded worker crops exactly as RandomResizedCrop would.
    reference = RandomResizedCrop(224, crop_ratio_range=PAPER_RANGE)
    image = np.empty((height, width, 1), np.uint8)
    for seed in range(100):
        np.random.seed(seed)
        ours = inception_crop_box(height, width, PAPER_RANGE)
        np.random.seed(seed)
        assert ours == reference.rand_crop_params(image), seed


def sample_boxes(n, size=4000, crop_ratio_range=PAPER_RANGE):
    np.random.seed(0)
    boxes = np.array([inception_crop_box(size, size, crop_ratio_range) for _ in range(n)], float)
    return boxes[:, 3] * boxes[:, 2] / size ** 2, boxes[:, 3] / boxes[:, 2]  # area fraction, w / h


def test_box_statistics_follow_the_inception_crop_definition():
    area, ratio = sample_boxes(20000)
    # On a square image every box with an area fraction <= 3/4 fits (sqrt(3/4 * 4/3) = 1), so below
    # that the accepted boxes are the proposals themselves: area uniform, aspect ratio log-uniform,
    # independent of each other.
    low = area <= 0.7
    assert low.sum() > 12000
    uniform_area = stats.uniform(loc=0.05, scale=0.7 - 0.05)
    log_uniform_ratio = stats.uniform(loc=math.log(RATIO_RANGE[0]), scale=math.log(RATIO_RANGE[1] / RATIO_RANGE[0]))
    assert stats.kstest(area[low], uniform_area.cdf).pvalue > 1e-3
    assert stats.kstest(np.log(ratio[low]), log_uniform_ratio.cdf).pvalue > 1e-3
    assert abs(stats.spearmanr(area[low], ratio[low]).statistic) < 0.03
    assert ratio.min() >= RATIO_RANGE[0] - 1e-3 and ratio.max() <= RATIO_RANGE[1] + 1e-3
    # Over the whole range: the same distribution as rejection sampling of the definition, written
    # independently (vectorised): draw (area, log ratio) uniformly, keep the boxes that fit.
    rng = np.random.default_rng(1)
    a = rng.uniform(*PAPER_RANGE, 60000)
    r = np.exp(rng.uniform(math.log(RATIO_RANGE[0]), math.log(RATIO_RANGE[1]), 60000))
    fits = (np.sqrt(a * r) <= 1) & (np.sqrt(a / r) <= 1)
    assert stats.ks_2samp(area, a[fits]).pvalue > 1e-3
    assert stats.ks_2samp(np.log(ratio), np.log(r[fits])).pvalue > 1e-3
    # The centred fallback (10 misses in a row) is rare on such an image: it would show as area 1.
    assert np.mean(area > 0.999) < 1e-3


def test_box_statistics_test_rejects_other_distributions():
    # The same tests, given mmpretrain's default range (0.08, 1) or a linear-uniform aspect ratio, fail.
    area, _ = sample_boxes(20000, crop_ratio_range=(0.08, 1.0))
    low = area <= 0.7
    assert stats.kstest(area[low], stats.uniform(loc=0.05, scale=0.65).cdf).pvalue < 1e-6
    rng = np.random.default_rng(2)
    linear = rng.uniform(*RATIO_RANGE, 20000)
    log_uniform = stats.uniform(loc=math.log(RATIO_RANGE[0]), scale=math.log(RATIO_RANGE[1] / RATIO_RANGE[0]))
    assert stats.kstest(np.log(linear), log_uniform.cdf).pvalue < 1e-6


def test_dct_factor_never_upsamples():
    assert dct_factor(447, 1000, 224, 224) == 1  # 447 / 2 < 224
    assert dct_factor(448, 448, 224, 224) == 2
    assert dct_factor(1000, 900, 224, 224) == 4
    assert dct_factor(4000, 3000, 224, 224) == 8
    assert dct_factor(4000, 3000, 224, 224, max_factor=2) == 2
    for h, w in np.random.default_rng(0).integers(1, 3000, (500, 2)):
        f = dct_factor(h, w, 224, 224)
        assert f in (1, 2, 4, 8) and (f == 1 or (h // f >= 224 and w // f >= 224))


# ----------------------------------------------------------------------------------------- header
@pytest.mark.parametrize('name', ['plain.jpg', 'progressive.jpg', 'gray.jpg'] +
                         [f'orient{k}.jpg' for k in range(1, 9)])
def test_jpeg_header_gives_the_size_opencv_decodes(files, name):
    data = read_bytes(files[name])
    decoded = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
    height, width, orientation = jpeg_header(data)
    assert (height, width) == decoded.shape[:2]
    assert orientation == (int(name[6]) if name.startswith('orient') else 1)
    stored = (427, 637) if name.startswith('orient') else (427, 640)
    assert (height, width) == (stored[::-1] if orientation >= 5 else stored)


def test_jpeg_header_is_none_for_other_data(files):
    data = read_bytes(files['plain.jpg'])
    assert jpeg_header(read_bytes(files['photo.png'])) is None
    assert jpeg_header(data[:40]) is None  # cut before the frame header
    assert jpeg_header(b'') is None


# ----------------------------------------------------------------------------------------- pixels
def reference_pipeline(scale, crop_ratio_range=PAPER_RANGE):
    return Compose([dict(type='LoadImageFromFile'),
                    dict(type='RandomResizedCrop', scale=scale, crop_ratio_range=crop_ratio_range)])


@pytest.mark.parametrize('name', ['plain.jpg', 'progressive.jpg', 'gray.jpg', 'orient6.jpg', 'orient7.jpg',
                                  'photo.png'])
def test_full_resolution_output_equals_mmpretrain_pipeline(files, name):
    # At 224 px no crop of a 640x427 photo is twice the output size: the full-resolution path, with
    # the decode (OpenCV, EXIF orientation applied), box and resize of LoadImageFromFile +
    # RandomResizedCrop. Same decoder, same seed: the very same pixels, not just close ones.
    ours = Compose([dict(type='vit_plugin.LoadAndInceptionCrop', scale=224, crop_ratio_range=PAPER_RANGE)])
    reference = reference_pipeline(224)
    for seed in range(8):
        np.random.seed(seed)
        got = ours(dict(img_path=files[name]))
        np.random.seed(seed)
        want = reference(dict(img_path=files[name]))
        assert got['img'].dtype == np.uint8 and got['img'].shape == (224, 224, 3)
        np.testing.assert_array_equal(got['img'], want['img'])
        assert got['img_shape'] == want['img_shape'] and got['ori_shape'] == want['ori_shape']


class DecodeSpy:
    """Records the reduction factor (1: full resolution) of every decode of the transform."""

    def __init__(self, monkeypatch):
        self.flags = []
        decode_stored = decode.decode_stored

        def spy(data, path, info, color_type='color', factor=1, backend='cv2'):
            self.flags.append(factor)
            return decode_stored(data, path, info, color_type, factor, backend)
        monkeypatch.setattr(decode, 'decode_stored', spy)


def area_reference(data, box, scale):
    """Full-resolution decode, the crop, and an area-averaging (anti-aliased) resize."""
    top, left, h, w = box
    img = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
    return cv2.resize(img[top:top + h, left:left + w], (scale, scale), interpolation=cv2.INTER_AREA).astype(float)


def snapped(box, factor, height, width, orientation):
    """The box with its edges on the grid of a 1/factor decode: multiples of factor from the image's
    origin, or from its far edge along an axis that the EXIF orientation reverses."""
    reversed_rows, reversed_cols = {2: (0, 1), 3: (1, 1), 4: (1, 0), 6: (0, 1), 7: (1, 1), 8: (1, 0)}.get(
        orientation, (0, 0))
    origin_y = height - math.ceil(height / factor) * factor if reversed_rows else 0
    origin_x = width - math.ceil(width / factor) * factor if reversed_cols else 0
    top, left, h, w = box
    y0 = max(round((top - origin_y) / factor) * factor + origin_y, 0)
    x0 = max(round((left - origin_x) / factor) * factor + origin_x, 0)
    y1 = min(round((top + h - origin_y) / factor) * factor + origin_y, height)
    x1 = min(round((left + w - origin_x) / factor) * factor + origin_x, width)
    return y0, x0, y1 - y0, x1 - x0


@pytest.mark.parametrize('name', ['plain.jpg'] + [f'orient{k}.jpg' for k in range(1, 9)])
def test_reduced_decode_equals_area_resized_full_decode(files, name, monkeypatch):
    # A 64 px output makes crops of >= 128 (256) px of the photo decode at 1/2 (1/4) resolution, with
    # the box moved onto that grid, whose origin depends on the EXIF orientation. libjpeg's scaled
    # IDCT low-passes each 8x8 block, so the reference is the full decode of that box resized with
    # area averaging. The two low-pass filters differ on fine texture: on these files the mean
    # |difference| is 0.2-6.5 levels per crop (median about 3), single pixels up to 79 at
    # high-contrast edges (ringing of the truncated DCT). Bounds: mean 8 per crop, median 4, max 100
    # (a wrong channel order or flip gives ~255; a grid off by half a reduced pixel breaks them).
    # mmpretrain's full-resolution bilinear resize is further from the same reference (median
    # 10.4-11.6: it aliases), and a box moved by 1/16 of its size lands far outside (median 26-31).
    spy = DecodeSpy(monkeypatch)
    data = read_bytes(files[name])
    height, width, orientation = jpeg_header(data)
    transform = LoadAndInceptionCrop(64, crop_ratio_range=PAPER_RANGE)
    factors, ours, bilinear, moved = [], [], [], []
    for seed in range(40):
        np.random.seed(seed)
        box = inception_crop_box(height, width, PAPER_RANGE)
        factor = dct_factor(box[2], box[3], 64, 64)
        np.random.seed(seed)
        spy.flags.clear()
        got = transform(dict(img_path=files[name]))['img'].astype(float)
        assert spy.flags == [factor]
        if factor == 1:
            continue
        factors.append(factor)
        grid_box = snapped(box, factor, height, width, orientation)
        want = area_reference(data, grid_box, 64)
        diff = np.abs(got - want)
        assert diff.mean() < 8 and diff.max() < 100, (seed, factor, diff.mean(), diff.max())
        ours.append(diff.mean())
        np.random.seed(seed)
        full = reference_pipeline(64)(dict(img_path=files[name]))['img'].astype(float)
        bilinear.append(np.abs(full - want).mean())
        top, left, h, w = grid_box
        shifted = (min(top + h // 16, height - h), min(left + w // 16, width - w), h, w)
        moved.append(np.abs(got - area_reference(data, shifted, 64)).mean())
    assert {2, 4} <= set(factors) and len(factors) >= 20
    assert np.median(ours) < 4 and np.median(ours) < np.median(bilinear)
    assert np.median(moved) > 8  # the bounds would notice a misplaced box


def test_reduced_decode_is_used_only_for_jpeg_and_when_enabled(files, monkeypatch):
    spy = DecodeSpy(monkeypatch)
    for name, max_dct_factor, expect_reduced in [('photo.png', 8, False), ('plain.jpg', 1, False),
                                                 ('plain.jpg', 8, True)]:
        transform = LoadAndInceptionCrop(16, crop_ratio_range=(0.9, 1.0), max_dct_factor=max_dct_factor)
        spy.flags.clear()
        out = transform(dict(img_path=files[name]))
        assert out['img'].shape == (16, 16, 3) and out['ori_shape'] == (427, 640)
        assert (spy.flags[0] > 1) == expect_reduced, name


# -------------------------------------------------------------------------- pipeline and registry
def test_packed_output_is_bgr_uint8_chw(tmp_path):
    # A pure red photo: BGR means red in the last channel; the data preprocessor's to_rgb=True then
    # puts it first, at +1 after the paper's (x - 127.5) / 127.5.
    red = np.zeros((600, 900, 3), np.uint8)
    red[..., 2] = 255
    path = str(tmp_path / 'red.jpg')
    cv2.imwrite(path, red, [cv2.IMWRITE_JPEG_QUALITY, 90])
    pipeline = Compose([dict(type='vit_plugin.LoadAndInceptionCrop', scale=224, crop_ratio_range=PAPER_RANGE),
                        dict(type='RandomFlip', prob=0.5, direction='horizontal'),
                        dict(type='PackInputs')])
    np.random.seed(0)
    packed = pipeline(dict(img_path=path, gt_label=3))
    inputs = packed['inputs']
    assert isinstance(inputs, torch.Tensor) and inputs.dtype == torch.uint8 and inputs.shape == (3, 224, 224)
    means = inputs.float().mean(dim=(1, 2))
    assert means[2] > 245 and means[0] < 10 and means[1] < 10
    assert packed['data_samples'].ori_shape == (600, 900)
    from mmpretrain.models import ClsDataPreprocessor
    pre = ClsDataPreprocessor(mean=[127.5] * 3, std=[127.5] * 3, to_rgb=True)
    batch = pre(dict(inputs=[inputs], data_samples=[packed['data_samples']]))
    rgb = batch['inputs'][0].mean(dim=(1, 2))
    assert rgb[0] > 0.9 and rgb[2] < -0.9


def test_registry_builds_from_a_config_dict():
    transform = TRANSFORMS.build(dict(type='vit_plugin.LoadAndInceptionCrop', scale=(160, 224),
                                      crop_ratio_range=PAPER_RANGE, interpolation='area'))
    assert isinstance(transform, LoadAndInceptionCrop)
    assert transform.scale == (160, 224) and transform.crop_ratio_range == PAPER_RANGE
    assert 'LoadAndInceptionCrop(scale=(160, 224)' in repr(transform)


@pytest.mark.parametrize('kwargs,message', [(dict(interpolation='cubic'), 'interpolation must be one of'),
                                            (dict(crop_ratio_range=(1.0, 0.05)), 'crop_ratio_range must be'),
                                            (dict(max_dct_factor=3), 'max_dct_factor must be'),
                                            (dict(scale=0), 'scale must be')])
def test_invalid_arguments_are_explained(kwargs, message):
    with pytest.raises(ValueError, match=message):
        LoadAndInceptionCrop(**{'scale': 224, **kwargs})


def test_file_client_args_load_through_backend_args_without_a_deprecation_warning(files):
    """A pipeline written with mmcv's older ``file_client_args`` reads the same pixels through
    ``fileio.get``, and mmengine logs none of its ``FileClient`` / ``HardDiskBackend`` warnings."""
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logger = MMLogger.get_current_instance()
    logger.addHandler(handler)
    try:
        loader = TRANSFORMS.build(dict(type='vit_plugin.LoadImageFromFile', file_client_args=dict(backend='disk')))
        img = loader(dict(img_path=files['plain.jpg']))['img']
    finally:
        logger.removeHandler(handler)
    assert loader.backend_args == dict(backend='local')
    assert np.array_equal(img, transforms.LoadImageFromFile()(dict(img_path=files['plain.jpg']))['img'])
    assert [r.getMessage() for r in records if r.levelno >= logging.WARNING] == []
    assert transforms.backend_args_of(dict(prefix='s3', path_mapping={'a': 'b'})) == dict(
        backend='petrel', path_mapping={'a': 'b'})
    assert transforms.backend_args_of(dict(prefix='http')) == dict(backend='http')
    with pytest.raises(ValueError, match='not both'):
        transforms.LoadImageFromFile(file_client_args=dict(backend='disk'), backend_args=dict(backend='local'))


def test_unreadable_file_names_the_path(tmp_path):
    path = tmp_path / 'broken.jpg'
    path.write_bytes(b'\xff\xd8 not a jpeg')
    with pytest.raises(decode.ImageDecodeError, match=r'broken\.jpg: not an image \(no JPEG, PNG'):
        LoadAndInceptionCrop(224)(dict(img_path=str(path)))


def test_pretraining_config_uses_the_fused_crop(files):
    cfg = Config.fromfile(osp.join(REPO, 'configs', '_base_', 'datasets', 'imagenet21k.py'))
    steps = cfg.train_dataloader.dataset.pipeline
    assert [s['type'] for s in steps] == ['vit_plugin.LoadAndInceptionCrop', 'RandomFlip', 'PackInputs']
    assert steps[0]['scale'] == 224 and tuple(steps[0]['crop_ratio_range']) == PAPER_RANGE
    packed = Compose(steps)(dict(img_path=files['plain.jpg'], gt_label=0))
    assert packed['inputs'].shape == (3, 224, 224)


# ------------------------------------------------------------- the crop box on broken and unusual files
def test_boxes_and_pixels_equal_random_resized_crop_over_a_sequence_with_a_header_mismatch(corpus, monkeypatch):
    # One seeded stream over a sequence of files, as a data-loader worker sees them. The XMP file is the
    # case where the JPEG header (its Exif orientation) and OpenCV's decoding disagree; our box is drawn
    # once, for the displayed size, and every later box still matches.
    names = ['orientation_1.jpg', 'orientation_6_after_xmp.jpg', 'png_named.jpg', 'orientation_8.jpg',
             'gif_named.jpg', 'orientation_6_after_xmp.jpg', 'cmyk.jpg', 'caf\u00e9 \u6771\u4eac.jpg']
    boxes = []
    box = transforms.inception_crop_box
    monkeypatch.setattr(transforms, 'inception_crop_box', lambda *a, **k: boxes.append(box(*a, **k)) or boxes[-1])
    ours = LoadAndInceptionCrop(32, crop_ratio_range=PAPER_RANGE)
    theirs = RandomResizedCrop(32, crop_ratio_range=PAPER_RANGE)
    for seed in range(5):
        np.random.seed(seed)
        boxes.clear()
        got = [ours(dict(img_path=corpus[n].path))['img'] for n in names]
        assert len(boxes) == len(names)  # one draw per image
        np.random.seed(seed)
        for n, img, drawn in zip(names, got, boxes):
            ref = corpus[n].reference
            assert theirs.rand_crop_params(ref) == drawn, (seed, n)
        np.random.seed(seed)
        for n, img in zip(names, got):
            want = theirs(dict(img=corpus[n].reference.copy()))['img']
            if n == 'cmyk.jpg':  # decoded within 1 level of the reference; the resize may round that to 2
                assert np.abs(img.astype(int) - want).max() <= 2
            else:
                np.testing.assert_array_equal(img, want, err_msg=f'{seed} {n}')


def test_a_decoder_that_disagrees_with_the_header_moves_the_box_without_a_new_draw(corpus, monkeypatch):
    # Whatever a decoder returns, the random stream after the transform is that of one box draw.
    case = corpus['orientation_1.jpg']
    real_decode = decode.decode_stored
    monkeypatch.setattr(decode, 'decode_stored',
                        lambda *a, **k: cv2.resize(real_decode(*a, **k), (154, 118), interpolation=cv2.INTER_NEAREST))
    np.random.seed(3)
    box = transforms.inception_crop_box(59, 77, PAPER_RANGE)
    after_one_draw = np.random.get_state()[1].copy()
    np.random.seed(3)
    out = LoadAndInceptionCrop(16, crop_ratio_range=PAPER_RANGE)(dict(img_path=case.path))
    np.testing.assert_array_equal(np.random.get_state()[1], after_one_draw)
    assert out['ori_shape'] == (118, 154)
    top, left, h, w = transforms.map_box(box, (59, 77), (118, 154))
    assert (top, left, h, w) == (2 * box[0], 2 * box[1], 2 * box[2], 2 * box[3])
    data = read_bytes(case.path)
    big = cv2.resize(real_decode(data, case.path, decode.inspect_image(data, case.path)), (154, 118),
                     interpolation=cv2.INTER_NEAREST)
    np.testing.assert_array_equal(out['img'], cv2.resize(big[top:top + h, left:left + w], (16, 16),
                                                         interpolation=cv2.INTER_LINEAR))
