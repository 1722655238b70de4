"""Image loaders with checked decoding, and a fused loader + Inception crop for JPEG training data.

Both loaders read files through :mod:`vit_plugin.datasets.decode`: a truncated file, a file that is no
image, an unsupported sample layout or a header declaring more than ``max_pixels`` pixels raises an
:class:`~vit_plugin.datasets.decode.ImageDecodeError` naming the file and the reason, before any large
allocation; a valid file gives the pixels of Pillow's ``exif_transpose`` + ``convert('RGB')`` (in BGR
order, as mmcv's loaders give them).

* :class:`LoadImageFromFile` (``vit_plugin.LoadImageFromFile``) is mmcv's ``LoadImageFromFile`` with
  that decoding: same arguments, same output keys.
* :class:`LoadAndInceptionCrop` fuses it with ``RandomResizedCrop``. ``LoadImageFromFile`` +
  ``RandomResizedCrop`` decode every image at full resolution and then throw most of it away: the crop
  keeps 5-100 % of the area and is resized to 224 px. When the crop box is sampled *before* decoding
  (it needs only the image size, read from the JPEG header), a crop that is at least twice the output
  size in both directions can be decoded at 1/2, 1/4 or 1/8 of the resolution straight from the DCT
  coefficients (libjpeg's scaled IDCT, exposed by OpenCV's ``IMREAD_REDUCED_COLOR_*`` flags), which
  skips much of the decoding work and never upsamples.

The JPEG decoder is OpenCV's, already a dependency through mmcv. Measured on ImageNet-sized JPEGs on
one core, the libjpeg-turbo decoders of OpenCV, torchvision and simplejpeg are within a few percent of
each other and Pillow's is about 1.5x slower; OpenCV's also decodes at reduced DCT scale and gives
exactly the pixels of mmcv's ``LoadImageFromFile``, so no other decoder earns a place.
``tools/analysis/benchmark_pipeline.py`` times the decoders, the checks and the whole pipeline against
mmpretrain's and torchvision's.
"""
import math
import struct
from typing import Optional, Sequence, Tuple, Union

import cv2
import mmengine.fileio as fileio
import numpy as np
from mmcv.transforms import BaseTransform
from mmcv.transforms import LoadImageFromFile as MMCVLoadImageFromFile

from vit_plugin.datasets import decode
from vit_plugin.datasets.decode import DEFAULT_MAX_PIXELS, inspect_image, orient
from vit_plugin.registry import TRANSFORMS

INTERPOLATIONS = {'nearest': cv2.INTER_NEAREST, 'bilinear': cv2.INTER_LINEAR, 'bicubic': cv2.INTER_CUBIC,
                  'area': cv2.INTER_AREA, 'lanczos': cv2.INTER_LANCZOS4}

#: Per EXIF orientation: whether the displayed image's rows and columns run backwards through the
#: stored ones. The 1/f grid of a reduced decode then starts at the far edge of that axis, which is
#: off the full-resolution grid when the stored size is not a multiple of f.
_REVERSED_AXES = {1: (False, False), 2: (False, True), 3: (True, True), 4: (True, False),
                  5: (False, False), 6: (False, True), 7: (True, True), 8: (True, False)}


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
    """``(height, width, orientation)`` of a JPEG: its displayed size (EXIF orientation applied) and the
    EXIF orientation (1-8, 1 when absent), read from the markers before the first scan; ``None`` when
    ``data`` is not a JPEG or its header is not understood. :func:`vit_plugin.datasets.decode.inspect_image`
    reads the same and also checks the file's completeness and size.

    A few marker lengths are read instead of opening the file with Pillow, which costs far more per
    image (docs/benchmarks.md#input-checks).
    """
    if data[:3] != b'\xff\xd8\xff':
        return None
    try:
        header = decode._jpeg_header(data)
    except (ValueError, IndexError, struct.error):
        return None
    if header.height <= 0 or header.width <= 0:
        return None
    if header.orientation in decode.TRANSPOSING_ORIENTATIONS:
        return header.width, header.height, header.orientation
    return header.height, header.width, header.orientation


def dct_factor(crop_h: int, crop_w: int, out_h: int, out_w: int, max_factor: int = 8) -> int:
    """The largest JPEG scaling factor (1, 2, 4 or 8, at most ``max_factor``) at which a
    ``crop_h`` x ``crop_w`` crop still has at least ``out_h`` x ``out_w`` pixels, so that the final
    resize never upsamples what the full-resolution decode would have downsampled."""
    factor = 1
    while factor * 2 <= max_factor and crop_h >= 2 * factor * out_h and crop_w >= 2 * factor * out_w:
        factor *= 2
    return factor


def map_box(box: Tuple[int, int, int, int], size: Tuple[int, int], real: Tuple[int, int]
            ) -> Tuple[int, int, int, int]:
    """The box ``(top, left, h, w)`` drawn for an image of ``size`` (h, w), scaled onto ``real`` (h, w):
    the same relative position and extent, at least one pixel, inside the image."""
    (top, left, h, w), (sh, sw), (rh, rw) = box, size, real
    y0, x0 = min(round(top * rh / sh), rh - 1), min(round(left * rw / sw), rw - 1)
    y1 = min(max(round((top + h) * rh / sh), y0 + 1), rh)
    x1 = min(max(round((left + w) * rw / sw), x0 + 1), rw)
    return y0, x0, y1 - y0, x1 - x0


@TRANSFORMS.register_module()
class LoadAndInceptionCrop(BaseTransform):
    """Load an image file, take an Inception crop and resize it: ``LoadImageFromFile`` followed by
    ``RandomResizedCrop`` in one step, with JPEG crops decoded at reduced resolution when large.

    The crop box is drawn once per image, from the size the file's header declares (the displayed
    size: EXIF orientation applied), with exactly the distribution and the random draws of mmpretrain's
    ``RandomResizedCrop``: for a given numpy seed, the boxes of a sequence of images equal
    ``RandomResizedCrop``'s on the decoded images. The header and the decoder agree on every file
    :func:`~vit_plugin.datasets.decode.inspect_image` accepts (the orientation is applied by us, not
    by the decoder). Should a decoder still return another size, the image is decoded at full
    resolution and the box is scaled onto its size (:func:`map_box`): it is never drawn a second time,
    so the random stream, and every later box, stays what it would have been.

    When the crop is at least ``2 * scale`` in both directions, a JPEG is decoded at 1/2, 1/4 or 1/8
    resolution (the largest that keeps the crop at least ``scale``) and the box is moved onto that pixel
    grid (by at most half an output pixel), which is faster and anti-aliases the reduction (libjpeg
    low-passes each 8x8 block in the DCT domain). Otherwise, and for other formats, the output is
    identical to the two-step pipeline's: the same OpenCV decode, crop and resize.

    **Required Keys:** ``img_path``; ``img_bytes`` when present (a sample of
    ``vit_plugin.TarShardDataset``) is decoded instead of reading ``img_path``, and removed.

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
        max_pixels (int, optional): Files whose header declares more pixels are refused (too large)
            before decoding. Defaults to :data:`~vit_plugin.datasets.decode.DEFAULT_MAX_PIXELS`
            (178,956,970); None: no limit.
        backend_args (dict, optional): mmengine file backend arguments, as for
            ``LoadImageFromFile``. Defaults to None (local files).

    Raises:
        ImageDecodeError: The file is truncated, not an image, of an unsupported mode, too large or
            corrupt (the message names it).
    """

    def __init__(self,
                 scale: Union[int, Sequence[int]],
                 crop_ratio_range: Tuple[float, float] = (0.08, 1.0),
                 aspect_ratio_range: Tuple[float, float] = (3. / 4., 4. / 3.),
                 max_attempts: int = 10,
                 interpolation: str = 'bilinear',
                 max_dct_factor: int = 8,
                 max_pixels: Optional[int] = DEFAULT_MAX_PIXELS,
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
        _check_max_pixels(max_pixels)
        self.scale = tuple(scale)
        self.crop_ratio_range = tuple(crop_ratio_range)
        self.aspect_ratio_range = tuple(aspect_ratio_range)
        self.max_attempts = max_attempts
        self.interpolation = interpolation
        self.max_dct_factor = max_dct_factor
        self.max_pixels = max_pixels
        self.backend_args = backend_args.copy() if backend_args else None

    def _box(self, height: int, width: int) -> Tuple[int, int, int, int]:
        return inception_crop_box(height, width, self.crop_ratio_range, self.aspect_ratio_range,
                                  self.max_attempts)

    def transform(self, results: dict) -> dict:
        """Decode ``results['img_path']`` and write the resized crop (see the class docstring)."""
        path = results['img_path']
        data = results.pop('img_bytes', None)  # a sample read from a tar shard brings its bytes
        if data is None:
            data = fileio.get(path, backend_args=self.backend_args)
        info = inspect_image(data, path, self.max_pixels)
        height, width = info.height, info.width
        box = top, left, crop_h, crop_w = self._box(height, width)  # the only draw
        out_h, out_w = self.scale
        crop = None
        factor = 1
        if info.format == 'JPEG' and self.max_dct_factor > 1:
            factor = dct_factor(crop_h, crop_w, out_h, out_w, self.max_dct_factor)
        if factor > 1:
            stored = decode.decode_stored(data, path, info, factor=factor)
            if stored.shape[:2] == decode.reduced_shape(info, factor):
                img = orient(stored, info.orientation)
                # The box on the reduced pixel grid: each edge moves by at most half a reduced
                # pixel (at most half an output pixel, as the reduced crop is >= scale), so area
                # and aspect ratio change by under 1/scale; the offset was uniform anyway.
                # (An exact sub-pixel warp costs 3x the resize for no statistical difference.)
                rows_reversed, cols_reversed = _REVERSED_AXES[info.orientation]
                oy = height - img.shape[0] * factor if rows_reversed else 0  # grid origin, <= 0
                ox = width - img.shape[1] * factor if cols_reversed else 0
                y0, x0 = round((top - oy) / factor), round((left - ox) / factor)
                y1 = min(round((top + crop_h - oy) / factor), img.shape[0])
                x1 = min(round((left + crop_w - ox) / factor), img.shape[1])
                crop = img[y0:y1, x0:x1]
        if crop is None:  # full resolution: small crops, other formats, or a decoder that disagreed
            img = orient(decode.decode_stored(data, path, info), info.orientation)
            if img.shape[:2] != (height, width):  # not the header's size: move the box, draw nothing
                top, left, crop_h, crop_w = map_box(box, (height, width), img.shape[:2])
                height, width = img.shape[:2]
            crop = img[top:top + crop_h, left:left + crop_w]
        out = cv2.resize(crop, (out_w, out_h), interpolation=INTERPOLATIONS[self.interpolation])
        results['img'] = out
        results['img_shape'] = out.shape
        results['ori_shape'] = (height, width)
        return results

    def __repr__(self) -> str:
        return (f'{self.__class__.__name__}(scale={self.scale}, crop_ratio_range={self.crop_ratio_range}, '
                f'aspect_ratio_range={self.aspect_ratio_range}, max_attempts={self.max_attempts}, '
                f'interpolation={self.interpolation!r}, max_dct_factor={self.max_dct_factor}, '
                f'max_pixels={self.max_pixels})')


#: mmengine's ``FileClient`` names of backends and URI prefixes, as ``backend_args`` name the backends.
_FILE_CLIENT_BACKENDS = {'disk': 'local'}
_FILE_CLIENT_PREFIXES = {'s3': 'petrel', 'petrel': 'petrel', 'http': 'http', 'https': 'http'}


def backend_args_of(file_client_args: dict) -> Optional[dict]:
    """mmengine's ``backend_args`` for the same storage as ``file_client_args`` (``FileClient``'s arguments).

    ``backend='disk'`` becomes ``'local'``; a ``prefix`` names its backend (``'s3'`` is petrel's), and the
    other arguments (``path_mapping``...) are kept. ``fileio.get`` reads through the backend without the
    deprecated ``FileClient`` and its warnings.
    """
    args = dict(file_client_args)
    prefix = args.pop('prefix', None)
    if 'backend' in args:
        args['backend'] = _FILE_CLIENT_BACKENDS.get(args['backend'], args['backend'])
    elif prefix is not None:
        args['backend'] = _FILE_CLIENT_PREFIXES.get(prefix, prefix)
    return args or None


def _check_max_pixels(max_pixels) -> None:
    if max_pixels is not None and (not isinstance(max_pixels, int) or max_pixels <= 0):
        raise ValueError(f'max_pixels must be a positive int or None (no limit), got {max_pixels!r}')


@TRANSFORMS.register_module()
class LoadImageFromFile(MMCVLoadImageFromFile):
    """mmcv's ``LoadImageFromFile`` with checked decoding: the right pixels or a named error.

    A drop-in replacement (``type='vit_plugin.LoadImageFromFile'``, the same arguments and output
    keys ``img``, ``img_shape``, ``ori_shape``) that decodes through
    :func:`vit_plugin.datasets.decode.decode_image`: a truncated file, a file that is no image, an
    unsupported mode, or a header declaring more than ``max_pixels`` pixels raises an
    ``ImageDecodeError`` naming the file and the reason (mmcv's raises ``AssertionError: failed to
    load image`` for some of them and decodes the others, e.g. a truncated file that the OpenCV build
    fills with grey, or a 30,000 x 30,000 header that it allocates). A result that already holds an
    ``img`` and no ``img_path`` (an inferencer that loaded the image itself) passes through; one with
    ``img_bytes`` (a sample of ``vit_plugin.TarShardDataset``) has those bytes decoded instead of the file
    ``img_path``, which then only names the sample in messages.

    Args:
        to_float32 (bool): Return float32 pixels. Defaults to False.
        color_type (str): 'color', 'grayscale', 'unchanged', 'color_ignore_orientation' or
            'grayscale_ignore_orientation' (mmcv's names). Defaults to 'color'.
        imdecode_backend (str): 'cv2' or 'pillow' (GIF and TIFF are always read by Pillow). mmcv's
            'turbojpeg' and 'tifffile' are refused: their output is not checked. Defaults to 'cv2'.
        file_client_args (dict, optional): The older spelling of ``backend_args`` (mmengine's
            ``FileClient`` arguments), read as ``backend_args`` (:func:`backend_args_of`), so that no
            ``FileClient`` is made. Not together with ``backend_args``. Defaults to None.
        ignore_empty (bool): Must stay False: mmcv's True makes the dataset replace any unreadable
            file by a random other one, silently. ``vit_plugin.SkipBadSamples`` replaces bad files
            deterministically, logs and counts them, and stops past a limit.
        backend_args (dict, optional): mmengine file backend arguments. Defaults to None.
        max_pixels (int, optional): Largest accepted height x width. Defaults to
            :data:`~vit_plugin.datasets.decode.DEFAULT_MAX_PIXELS`; None: no limit.
    """

    def __init__(self, to_float32: bool = False, color_type: str = 'color', imdecode_backend: str = 'cv2',
                 file_client_args: Optional[dict] = None, ignore_empty: bool = False, *,
                 backend_args: Optional[dict] = None, max_pixels: Optional[int] = DEFAULT_MAX_PIXELS) -> None:
        if ignore_empty:
            raise ValueError('vit_plugin.LoadImageFromFile(ignore_empty=True) would replace unreadable files by '
                             'random other samples without a word; wrap the training dataset in '
                             "dict(type='vit_plugin.SkipBadSamples', dataset=..., max_fraction=...) instead, "
                             'which logs and counts every skipped file (docs/configs.md).')
        if color_type not in decode.COLOR_TYPES:
            raise ValueError(f'color_type must be one of {sorted(decode.COLOR_TYPES)}, got {color_type!r}')
        if imdecode_backend not in decode.BACKENDS:
            raise ValueError(f'imdecode_backend must be one of {decode.BACKENDS}, got {imdecode_backend!r} '
                             f"(use mmcv's LoadImageFromFile for other backends; their files are not checked)")
        _check_max_pixels(max_pixels)
        if file_client_args is not None:
            if backend_args is not None:
                raise ValueError('vit_plugin.LoadImageFromFile: give backend_args or file_client_args (its older '
                                 'spelling), not both.')
            backend_args = backend_args_of(file_client_args)
        super().__init__(to_float32=to_float32, color_type=color_type, imdecode_backend=imdecode_backend,
                         ignore_empty=False, backend_args=backend_args)
        self.max_pixels = max_pixels

    def transform(self, results: dict) -> dict:
        if 'img_path' not in results and 'img' in results:
            return results
        filename = results['img_path']
        data = results.pop('img_bytes', None)  # a sample read from a tar shard brings its bytes
        if data is None:
            data = fileio.get(filename, backend_args=self.backend_args)
        img = decode.decode_image(data, filename, self.color_type, self.imdecode_backend, self.max_pixels)
        if self.to_float32:
            img = img.astype(np.float32)
        results['img'] = img
        results['img_shape'] = img.shape[:2]
        results['ori_shape'] = img.shape[:2]
        return results

    def __repr__(self) -> str:
        return (f'{self.__class__.__name__}(to_float32={self.to_float32}, color_type={self.color_type!r}, '
                f'imdecode_backend={self.imdecode_backend!r}, max_pixels={self.max_pixels}, '
                f'backend_args={self.backend_args})')
