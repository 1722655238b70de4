"""A fused image loader and Inception crop for JPEG training data.

``LoadImageFromFile`` + ``RandomResizedCrop`` decode every image at full resolution and then throw
most of it away: the crop keeps 5-100 % of the area and is resized to 224 px. When the crop box is
sampled *before* decoding (it needs only the image size, read from the JPEG header), a crop that is
at least twice the output size in both directions can be decoded at 1/2, 1/4 or 1/8 of the
resolution straight from the DCT coefficients (libjpeg's scaled IDCT, exposed by OpenCV's
``IMREAD_REDUCED_COLOR_*`` flags), which skips much of the decoding work and never upsamples.

The decoder is OpenCV's, already a dependency through mmcv. Measured on ImageNet-sized JPEGs on one
core, the libjpeg-turbo decoders of OpenCV, torchvision and simplejpeg are within a few percent of
each other and Pillow's is about 1.5x slower; OpenCV's also decodes at reduced DCT scale, applies the
EXIF orientation and gives exactly the pixels of mmcv's ``LoadImageFromFile``, so no other decoder
earns a place. ``tools/analysis/benchmark_pipeline.py`` times the decoders and the whole pipeline
against mmpretrain's and torchvision's.
"""
import math
import struct
from typing import Optional, Sequence, Tuple, Union

import cv2
import mmengine.fileio as fileio
import numpy as np
from mmcv.transforms import BaseTransform

from vit_plugin.registry import TRANSFORMS

#: OpenCV flags that decode a JPEG at 1/factor of its size through libjpeg's scaled IDCT (EXIF
#: orientation is applied, as with ``IMREAD_COLOR``, which mmcv's ``LoadImageFromFile`` uses).
REDUCED_FLAGS = {2: cv2.IMREAD_REDUCED_COLOR_2, 4: cv2.IMREAD_REDUCED_COLOR_4, 8: cv2.IMREAD_REDUCED_COLOR_8}

INTERPOLATIONS = {'nearest': cv2.INTER_NEAREST, 'bilinear': cv2.INTER_LINEAR, 'bicubic': cv2.INTER_CUBIC,
                  'area': cv2.INTER_AREA, 'lanczos': cv2.INTER_LANCZOS4}

#: EXIF orientations that transpose the stored image (width and height swap on decode).
_TRANSPOSING_ORIENTATIONS = (5, 6, 7, 8)
#: Per EXIF orientation: whether the decoded image's rows and columns run backwards through the
#: stored ones. The 1/f grid of a reduced decode then starts at the far edge of that axis, which is
#: off the full-resolution grid when the stored size is not a multiple of f.
_REVERSED_AXES = {1: (False, False), 2: (False, True), 3: (True, True), 4: (True, False),
                  5: (False, False), 6: (False, True), 7: (True, True), 8: (True, False)}
#: Start-of-frame markers (baseline, extended, progressive, lossless; Huffman or arithmetic coded).
_SOF_MARKERS = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}


def inception_crop_box(height: int, width: int, crop_ratio_range: Tuple[float, float] = (0.08, 1.0),
                       aspect_ratio_range: Tuple[float, float] = (3. / 4., 4. / 3.),
                       max_attempts: int = 10) -> Tuple[int, int, int, int]:
    """Sample an Inception crop box, exactly as mmpretrain's ``RandomResizedCrop`` does.

    Up to ``max_attempts`` times: an area fraction uniform in ``crop_ratio_range`` and an aspect ratio
    (width / height) log-uniform in ``aspect_ratio_range``; the first box that fits is placed
    uniformly. If none fits, the largest centred box whose aspect ratio is within the range.

    The draws go through numpy's global generator in mmpretrain's order, so a seed gives the same box
    as ``RandomResizedCrop`` on an image of that size (and per-worker seeding works the same way).

    Args:
        height (int): Image height.
        width (int): Image width.
        crop_ratio_range (tuple[float, float]): Range of the crop's area as a fraction of the image's.
            Defaults to (0.08, 1.0).
        aspect_ratio_range (tuple[float, float]): Range of the crop's width / height.
            Defaults to (3/4, 4/3).
        max_attempts (int): Samples tried before the centred fallback. Defaults to 10.

    Returns:
        tuple[int, int, int, int]: ``(offset_h, offset_w, target_h, target_w)``.
    """
    area = height * width
    log_ratio = (math.log(aspect_ratio_range[0]), math.log(aspect_ratio_range[1]))
    for _ in range(max_attempts):
        target_area = np.random.uniform(*crop_ratio_range) * area
        aspect_ratio = math.exp(np.random.uniform(*log_ratio))
        target_w = int(round(math.sqrt(target_area * aspect_ratio)))
        target_h = int(round(math.sqrt(target_area / aspect_ratio)))
        if 0 < target_w <= width and 0 < target_h <= height:
            offset_h = np.random.randint(0, height - target_h + 1)
            offset_w = np.random.randint(0, width - target_w + 1)
            return offset_h, offset_w, target_h, target_w
    in_ratio = float(width) / float(height)
    if in_ratio < min(aspect_ratio_range):
        target_w, target_h = width, int(round(width / min(aspect_ratio_range)))
    elif in_ratio > max(aspect_ratio_range):
        target_w, target_h = int(round(height * max(aspect_ratio_range))), height
    else:
        target_w, target_h = width, height
    return (height - target_h) // 2, (width - target_w) // 2, target_h, target_w


def jpeg_header(data: bytes) -> Optional[Tuple[int, int, int]]:
    """``(height, width, orientation)`` of a JPEG: its size as OpenCV decodes it (EXIF orientation
    applied) and the EXIF orientation (1-8, 1 when absent), read from the markers before the first
    scan; ``None`` when ``data`` is not a JPEG or its header is not understood (the caller then
    decodes it in full).

    A few marker lengths are read instead of opening the file with Pillow (about 1 us against 20-40
    us per image, 2-4 % of a whole ImageNet-sized decode).
    """
    try:
        if data[:2] != b'\xff\xd8':  # SOI
            return None
        pos, end, orientation = 2, len(data), 1
        while pos + 4 <= end:
            if data[pos] != 0xFF:
                return None
            marker = data[pos + 1]
            if marker == 0xFF:  # fill byte before a marker
                pos += 1
                continue
            if marker in _SOF_MARKERS:
                height, width = struct.unpack_from('>HH', data, pos + 5)
                if height == 0 or width == 0 or orientation not in _REVERSED_AXES:
                    return None  # height 0: defined later by a DNL marker
                if orientation in _TRANSPOSING_ORIENTATIONS:
                    height, width = width, height
                return height, width, orientation
            if marker == 0xE1 and data[pos + 4:pos + 10] == b'Exif\x00\x00':
                orientation = _exif_orientation(data, pos + 10)
            pos += 2 + ((data[pos + 2] << 8) | data[pos + 3])
    except (IndexError, struct.error):  # truncated header
        return None
    return None


def _exif_orientation(data: bytes, tiff: int) -> int:
    """Orientation tag (0x0112) of IFD0 of the TIFF structure at ``data[tiff:]``; 1 if absent."""
    order = '<' if data[tiff:tiff + 2] == b'II' else '>'
    ifd = tiff + struct.unpack_from(order + 'I', data, tiff + 4)[0]
    for k in range(struct.unpack_from(order + 'H', data, ifd)[0]):
        entry = ifd + 2 + 12 * k
        if struct.unpack_from(order + 'H', data, entry)[0] == 0x0112:
            return struct.unpack_from(order + 'H', data, entry + 8)[0]
    return 1


def dct_factor(crop_h: int, crop_w: int, out_h: int, out_w: int, max_factor: int = 8) -> int:
    """The largest JPEG scaling factor (1, 2, 4 or 8, at most ``max_factor``) at which a
    ``crop_h`` x ``crop_w`` crop still has at least ``out_h`` x ``out_w`` pixels, so that the final
    resize never upsamples what the full-resolution decode would have downsampled."""
    factor = 1
    while factor * 2 <= max_factor and crop_h >= 2 * factor * out_h and crop_w >= 2 * factor * out_w:
        factor *= 2
    return factor


def _decode(data: bytes, flag: int, path) -> np.ndarray:
    img = cv2.imdecode(np.frombuffer(data, np.uint8), flag)
    if img is None:
        raise ValueError(f'cannot decode the image {path!r}: not an image file, or a corrupt one')
    return img


@TRANSFORMS.register_module()
class LoadAndInceptionCrop(BaseTransform):
    """Load an image file, take an Inception crop and resize it: ``LoadImageFromFile`` followed by
    ``RandomResizedCrop`` in one step, with JPEG crops decoded at reduced resolution when large.

    The crop box has exactly the distribution (and, for a given numpy seed, the value) of
    mmpretrain's ``RandomResizedCrop``. When the crop is at least ``2 * scale`` in both directions,
    a JPEG is decoded at 1/2, 1/4 or 1/8 resolution (the largest that keeps the crop at least
    ``scale``) and the box is moved onto that pixel grid (by at most half an output pixel), which is
    faster and anti-aliases the reduction (libjpeg low-passes each 8x8 block in the DCT domain).
    Otherwise, and for other formats, the output is identical to the two-step pipeline's: the same
    OpenCV decode, crop and resize.

    **Required Keys:** ``img_path``.

    **Added Keys:** ``img`` (BGR uint8, ``scale`` sized), ``img_shape`` (the output's
    ``img.shape``, as ``RandomResizedCrop`` writes it), ``ori_shape`` (the file's full-resolution
    ``(height, width)``).

    Args:
        scale (int | Sequence[int]): Output size; an int gives a square, a pair is ``(h, w)``.
        crop_ratio_range (tuple[float, float]): Crop area as a fraction of the image's.
            Defaults to (0.08, 1.0), mmpretrain's default; the ViT paper uses (0.05, 1.0).
        aspect_ratio_range (tuple[float, float]): Crop width / height, sampled log-uniformly.
            Defaults to (3/4, 4/3).
        max_attempts (int): Box samples tried before the centred fallback. Defaults to 10.
        interpolation (str): OpenCV resize of the crop: 'nearest', 'bilinear', 'bicubic', 'area' or
            'lanczos'. Defaults to 'bilinear' (mmpretrain's default).
        max_dct_factor (int): Largest JPEG reduction used: 1 (always full resolution), 2, 4 or 8.
            Defaults to 8.
        backend_args (dict, optional): mmengine file backend arguments, as for
            ``LoadImageFromFile``. Defaults to None (local files).
    """

    def __init__(self,
                 scale: Union[int, Sequence[int]],
                 crop_ratio_range: Tuple[float, float] = (0.08, 1.0),
                 aspect_ratio_range: Tuple[float, float] = (3. / 4., 4. / 3.),
                 max_attempts: int = 10,
                 interpolation: str = 'bilinear',
                 max_dct_factor: int = 8,
                 backend_args: Optional[dict] = None) -> None:
        if isinstance(scale, int):
            scale = (scale, scale)
        if len(scale) != 2 or min(scale) <= 0:
            raise ValueError(f'scale must be a positive int or an (h, w) pair, got {scale!r}')
        for name, (low, high) in (('crop_ratio_range', crop_ratio_range),
                                  ('aspect_ratio_range', aspect_ratio_range)):
            if not 0 < low <= high:
                raise ValueError(f'{name} must be (min, max) with 0 < min <= max, got {(low, high)}')
        if not isinstance(max_attempts, int) or max_attempts < 0:
            raise ValueError(f'max_attempts must be an int >= 0, got {max_attempts!r}')
        if interpolation not in INTERPOLATIONS:
            raise ValueError(f'interpolation must be one of {sorted(INTERPOLATIONS)}, got {interpolation!r}')
        if max_dct_factor not in (1, 2, 4, 8):
            raise ValueError(f'max_dct_factor must be 1, 2, 4 or 8, got {max_dct_factor!r}')
        self.scale = tuple(scale)
        self.crop_ratio_range = tuple(crop_ratio_range)
        self.aspect_ratio_range = tuple(aspect_ratio_range)
        self.max_attempts = max_attempts
        self.interpolation = interpolation
        self.max_dct_factor = max_dct_factor
        self.backend_args = backend_args.copy() if backend_args else None

    def _box(self, height: int, width: int) -> Tuple[int, int, int, int]:
        return inception_crop_box(height, width, self.crop_ratio_range, self.aspect_ratio_range,
                                  self.max_attempts)

    def transform(self, results: dict) -> dict:
        """Decode ``results['img_path']`` and write the resized crop (see the class docstring)."""
        path = results['img_path']
        data = fileio.get(path, backend_args=self.backend_args)
        out_h, out_w = self.scale
        header = jpeg_header(data) if self.max_dct_factor > 1 else None
        img = None
        if header is not None:
            height, width, orientation = header
            top, left, crop_h, crop_w = self._box(height, width)
            factor = dct_factor(crop_h, crop_w, out_h, out_w, self.max_dct_factor)
            if factor > 1:
                img = _decode(data, REDUCED_FLAGS[factor], path)
                # libjpeg's scaled output is ceil(size / factor); anything else means the header
                # and the decoder disagree (e.g. on the orientation): decode in full instead.
                if img.shape[:2] != (-(-height // factor), -(-width // factor)):
                    img = None
                else:
                    # The box on the reduced pixel grid: each edge moves by at most half a reduced
                    # pixel (at most half an output pixel, as the reduced crop is >= scale), so area
                    # and aspect ratio change by under 1/scale; the offset was uniform anyway.
                    # (An exact sub-pixel warp costs 3x the resize for no statistical difference.)
                    rows_reversed, cols_reversed = _REVERSED_AXES[orientation]
                    oy = height - img.shape[0] * factor if rows_reversed else 0  # grid origin, <= 0
                    ox = width - img.shape[1] * factor if cols_reversed else 0
                    y0, x0 = round((top - oy) / factor), round((left - ox) / factor)
                    y1 = min(round((top + crop_h - oy) / factor), img.shape[0])
                    x1 = min(round((left + crop_w - ox) / factor), img.shape[1])
                    crop = img[y0:y1, x0:x1]
            else:
                img = _decode(data, cv2.IMREAD_COLOR, path)
                if img.shape[:2] != (height, width):
                    img = None
                else:
                    crop = img[top:top + crop_h, left:left + crop_w]
        if img is None:  # not a JPEG, DCT scaling off, or a header the decoder disagreed with
            img = _decode(data, cv2.IMREAD_COLOR, path)
            height, width = img.shape[:2]
            top, left, crop_h, crop_w = self._box(height, width)
            crop = img[top:top + crop_h, left:left + crop_w]
        out = cv2.resize(crop, (out_w, out_h), interpolation=INTERPOLATIONS[self.interpolation])
        results['img'] = out
        results['img_shape'] = out.shape
        results['ori_shape'] = (height, width)
        return results

    def __repr__(self) -> str:
        return (f'{self.__class__.__name__}(scale={self.scale}, crop_ratio_range={self.crop_ratio_range}, '
                f'aspect_ratio_range={self.aspect_ratio_range}, max_attempts={self.max_attempts}, '
                f'interpolation={self.interpolation!r}, max_dct_factor={self.max_dct_factor})')
