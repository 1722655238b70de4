"""Checked image decoding: the right pixels, or an error that names the file and what is wrong.

Every image loader of vit_plugin (``vit_plugin.LoadAndInceptionCrop``, ``vit_plugin.LoadImageFromFile``
and ``tools/infer.py``) reads files through this module, so all of them accept and refuse the same
files and give the same pixels. Before any pixel is decoded, the file's own structure is read (a few
markers or chunks, microseconds per file):

* **not an image**: an empty file, or one without the signature of a supported format (JPEG, PNG, GIF,
  BMP, WebP, TIFF), e.g. a text or HTML file named ``.JPEG``;
* **too large**: the header declares more than ``max_pixels`` pixels (:data:`DEFAULT_MAX_PIXELS`:
  178,956,970, Pillow's own refusal threshold, far above any real ImageNet-21k photo). A small file
  that declares a huge image (a decompression bomb) is refused before anything is allocated;
* **unsupported mode**: a sample layout the decoders cannot turn into 8-bit colour, e.g. a 12-bit or
  2-component JPEG, or a 32-bit integer / float TIFF;
* **truncated**: the file ends before its structure does: a JPEG without its end-of-image marker
  after the image data, a PNG without its ``IEND`` chunk, a GIF whose blocks run past the end, a BMP,
  WebP or TIFF shorter than the sizes its header declares. This does not depend on the decoder: some
  libjpeg builds fill a cut JPEG with grey rows and return it, and Pillow does the same when
  ``ImageFile.LOAD_TRUNCATED_IMAGES`` is set; both are caught here;
* **corrupt**: the structure is complete but the decoder cannot read the data.

Each error is an :class:`ImageDecodeError` whose message names the file, the reason and what to do,
for where the image lives (:data:`SOURCES`: a file of a folder, a file a list names, a sample of a tar
shard, an image of a tar of tars; the datasets re-word it with :meth:`ImageDecodeError.for_source`).

Pixels (``color_type='color'``, the default): BGR ``uint8`` of shape (H, W, 3), exactly those of
Pillow's ``ImageOps.exif_transpose(img).convert('RGB')`` (reversed to BGR), with two documented
exceptions: CMYK JPEGs differ by at most 1 level (OpenCV and Pillow round the CMYK-to-RGB conversion
differently), and 16-bit grayscale PNGs keep the high byte of every sample (what OpenCV and libpng do,
and what Pillow does for 16-bit colour PNGs; Pillow's ``convert('RGB')`` of 16-bit grayscale clips at
255 instead). Alpha is dropped, as both libraries do. The EXIF orientation is applied here, from the
first Exif segment of a JPEG (Pillow's rule), the ``eXIf`` chunk of a PNG or the ``EXIF`` chunk of a
WebP (Pillow applies a TIFF's orientation tag while reading it). mmcv's ``LoadImageFromFile`` leaves
that to OpenCV, which reads only the *first* APP1 segment of a JPEG (so it ignores an Exif segment
placed after e.g. an XMP one) and ignores WebP orientation. ``*_ignore_orientation`` colour types keep
the stored orientation.

JPEG, PNG, BMP and WebP are decoded by OpenCV (the decoder of mmcv's ``LoadImageFromFile``, with
JPEG reduction by 1/2, 1/4, 1/8 in the DCT domain); GIF (first frame), which OpenCV does not read, and
TIFF, whose orientation Pillow applies while reading, by Pillow.
"""
import io
import math
import struct
import warnings
from typing import NamedTuple, Optional, Tuple

import cv2
import numpy as np
from PIL import Image

#: The default pixel limit (height x width as declared by the header): Pillow's refusal threshold
#: (2 x ``PIL.Image.MAX_IMAGE_PIXELS``), 537 MB as decoded BGR. Real photos, ImageNet-21k's largest
#: included (a few tens of megapixels), are far below it; a decompression bomb is far above.
DEFAULT_MAX_PIXELS = 178_956_970

TRUNCATED = 'truncated'
NOT_AN_IMAGE = 'not an image'
UNSUPPORTED_MODE = 'unsupported mode'
TOO_LARGE = 'too large'
CORRUPT = 'corrupt'
REASONS = (TRUNCATED, NOT_AN_IMAGE, UNSUPPORTED_MODE, TOO_LARGE, CORRUPT)

#: Where an image lives: a file (of a folder), a file a list file names, a sample of a tar shard, an
#: image inside an inner tar of a tar of tars.
SOURCES = ('file', 'list', 'shard', 'tar_of_tars')

_ADVICE = {
    'file': {
        TRUNCATED: 'copy or download the file again',
        NOT_AN_IMAGE: 'replace it with the image, or delete it',
        UNSUPPORTED_MODE: 'convert it to 8-bit RGB, e.g. PIL.Image.open(path).convert("RGB").save(path)',
        TOO_LARGE: 'downscale it, or raise max_pixels of the loader if the image is genuine',
        CORRUPT: 'copy or download the file again, or replace it',
    },
    'list': {
        TRUNCATED: 'copy or download the file again',
        NOT_AN_IMAGE: 'replace it with the image, or remove its line from {list_file}',
        UNSUPPORTED_MODE: 'convert it to 8-bit RGB, e.g. PIL.Image.open(path).convert("RGB").save(path)',
        TOO_LARGE: 'downscale it, or raise max_pixels of the loader if the image is genuine',
        CORRUPT: 'copy or download the file again, or remove its line from {list_file}',
    },
    'shard': {
        TRUNCATED: 'download the shard again',
        NOT_AN_IMAGE: 'write the shard again with this sample replaced or left out',
        UNSUPPORTED_MODE: 'write the shard again with this image in 8-bit RGB, or without it',
        TOO_LARGE: 'raise max_pixels of the loader if the image is genuine, or write the shard again without it',
        CORRUPT: 'download the shard again, or write it again with this sample replaced or left out',
    },
    'tar_of_tars': {
        TRUNCATED: 'download the archive again',
        NOT_AN_IMAGE: 'the archive cannot be edited in place',
        UNSUPPORTED_MODE: 'the archive cannot be edited in place',
        TOO_LARGE: 'raise max_pixels of the loader if the image is genuine',
        CORRUPT: 'download the archive again',
    },
}

#: Colour types (mmcv's names) and the OpenCV flag of each.
COLOR_TYPES = {
    'color': cv2.IMREAD_COLOR,
    'grayscale': cv2.IMREAD_GRAYSCALE,
    'unchanged': cv2.IMREAD_UNCHANGED,
    'color_ignore_orientation': cv2.IMREAD_COLOR,
    'grayscale_ignore_orientation': cv2.IMREAD_GRAYSCALE,
}
#: OpenCV flags that decode a JPEG at 1/factor of its size through libjpeg's scaled IDCT.
REDUCED_FLAGS = {2: cv2.IMREAD_REDUCED_COLOR_2, 4: cv2.IMREAD_REDUCED_COLOR_4, 8: cv2.IMREAD_REDUCED_COLOR_8}
BACKENDS = ('cv2', 'pillow')

#: EXIF orientations that transpose the stored image (width and height swap on display).
TRANSPOSING_ORIENTATIONS = (5, 6, 7, 8)
#: Start-of-frame markers (baseline, extended, progressive, lossless; Huffman or arithmetic coded).
_SOF_MARKERS = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
_STANDALONE_MARKERS = frozenset([0x01, 0xD8, *range(0xD0, 0xD8)])  # TEM, SOI, RSTn: no length field
_PNG_SIGNATURE = b'\x89PNG\r\n\x1a\n'
_TIFF_SIGNATURES = (b'II*\x00', b'MM\x00*')
_BMP_HEADER_SIZES = frozenset(struct.pack('<I', n) for n in (12, 40, 52, 56, 64, 108, 124))
_PIL_8BIT_MODES = frozenset(['1', 'L', 'P', 'RGB', 'RGBA', 'RGBX', 'CMYK', 'YCbCr', 'LA', 'La', 'PA', 'RGBa'])
_PIL_16BIT_MODES = frozenset(['I;16', 'I;16B', 'I;16L', 'I;16N'])
#: Formats always decoded by Pillow: GIF (this OpenCV build does not read it) and TIFF (Pillow applies
#: the orientation tag itself; OpenCV's libtiff path applies it even when asked not to).
_PILLOW_FORMATS = ('GIF', 'TIFF')


class ImageDecodeError(ValueError):
    """An image file that cannot give correct pixels. ``path`` names it, ``reason`` is one of
    :data:`REASONS` (``'truncated'``, ``'not an image'``, ``'unsupported mode'``, ``'too large'``,
    ``'corrupt'``). The message says both and what to do (for a file, until :meth:`for_source`)."""

    def __init__(self, message: str, path: Optional[str] = None, reason: Optional[str] = None,
                 detail: Optional[str] = None):
        super().__init__(message)
        self.path = path
        self.reason = reason
        self.detail = detail

    def __reduce__(self):  # keeps the fields through pickling (data-loader workers)
        return type(self), (str(self), self.path, self.reason, self.detail)

    def for_source(self, source: str, list_file: Optional[str] = None) -> 'ImageDecodeError':
        """The same error with the advice for where the image lives (one of :data:`SOURCES`; ``list_file``
        names the list for ``'list'``); itself when it carries no reason."""
        if self.reason not in REASONS or self.path is None:
            return self
        return image_error(self.path, self.reason, self.detail, source, list_file)


def image_error(path, reason: str, detail: str, source: str = 'file',
                list_file: Optional[str] = None) -> ImageDecodeError:
    """The :class:`ImageDecodeError` for ``path``: ``'<path>: <reason> (<detail>); <what to do>.'``, the
    advice for ``source`` (:data:`SOURCES`; a list file's name in ``list_file``)."""
    if source not in _ADVICE:
        raise ValueError(f'image_error: source={source!r}; use one of {SOURCES}')
    advice = _ADVICE[source][reason].format(list_file=list_file or 'the list file')
    skip = 'such files' if source in ('file', 'list') else 'such samples'
    return ImageDecodeError(f'{path}: {reason} ({detail}); {advice}. A training run can skip and count {skip} '
                            f'with vit_plugin.SkipBadSamples.', str(path), reason, detail)


class ImageInfo(NamedTuple):
    """What the header of an image file says (see :func:`inspect_image`)."""
    format: str  #: 'JPEG', 'PNG', 'GIF', 'BMP', 'WEBP' or 'TIFF'
    height: int  #: as displayed: after the EXIF orientation
    width: int
    orientation: int  #: EXIF orientation 1-8 (1 when absent)
    stored_height: int  #: as stored in the file
    stored_width: int


class _Header(NamedTuple):
    height: int
    width: int
    orientation: int = 1
    mode_problem: Optional[str] = None  # why the sample layout is unsupported
    truncation: Optional[str] = None  # why the file is incomplete


def _sniff(data: bytes) -> Optional[str]:
    if data[:3] == b'\xff\xd8\xff':
        return 'JPEG'
    if data[:8] == _PNG_SIGNATURE:
        return 'PNG'
    if data[:6] in (b'GIF87a', b'GIF89a'):
        return 'GIF'
    if data[:2] == b'BM' and data[6:10] == b'\0\0\0\0' and data[14:18] in _BMP_HEADER_SIZES:
        return 'BMP'
    if data[:4] == b'RIFF' and data[8:12] == b'WEBP':
        return 'WEBP'
    if data[:4] in _TIFF_SIGNATURES:
        return 'TIFF'
    return None


def exif_orientation(tiff: bytes) -> int:
    """The orientation tag (0x0112) of IFD0 of an EXIF payload (a TIFF structure, optionally after
    ``Exif\\0\\0``); 1 when absent, out of range (1-8) or unreadable, as Pillow and OpenCV treat it."""
    if tiff[:6] == b'Exif\x00\x00':
        tiff = tiff[6:]
    try:
        order = {b'II': '<', b'MM': '>'}[bytes(tiff[:2])]
        ifd = struct.unpack_from(order + 'I', tiff, 4)[0]
        for k in range(struct.unpack_from(order + 'H', tiff, ifd)[0]):
            entry = ifd + 2 + 12 * k
            tag, typ = struct.unpack_from(order + 'HH', tiff, entry)
            if tag == 0x0112:
                value = struct.unpack_from(order + ('I' if typ == 4 else 'H'), tiff, entry + 8)[0]
                return value if 1 <= value <= 8 else 1
    except (KeyError, struct.error, IndexError):
        pass
    return 1


def _jpeg_header(data: bytes) -> _Header:
    pos, end = 2, len(data)
    orientation, frame = None, None
    while True:
        if pos + 4 > end:
            return _Header(*(frame or (0, 0))[:2], truncation=f'the file ends inside its header, after {end} bytes')
        if data[pos] != 0xFF:
            raise ValueError(f'no JPEG marker at byte {pos}')
        marker = data[pos + 1]
        if marker == 0xFF:  # fill byte
            pos += 1
            continue
        if marker in _STANDALONE_MARKERS:
            pos += 2
            continue
        if marker == 0xD9:
            raise ValueError('end-of-image marker before any image data')
        length = (data[pos + 2] << 8) | data[pos + 3]
        if marker == 0xDA:  # start of scan: the entropy-coded data follows
            break
        if marker in _SOF_MARKERS:
            if pos + 10 > end:
                return _Header(0, 0, truncation=f'the file ends inside its frame header, after {end} bytes')
            precision, height, width, components = struct.unpack_from('>BHHB', data, pos + 4)
            frame = (height, width, precision, components, marker)
        elif marker == 0xE1 and orientation is None and data[pos + 4:pos + 10] == b'Exif\x00\x00':
            orientation = exif_orientation(data[pos + 10:pos + 2 + length])  # the first Exif segment
        pos += 2 + length
    if frame is None:
        raise ValueError('no frame header (SOF) before the image data')
    height, width, precision, components, marker = frame
    problem = None
    if precision != 8:
        problem = f'{precision}-bit samples; the decoders read 8-bit JPEGs'
    elif components not in (1, 3, 4):
        problem = f'{components} colour components; gray (1), colour (3) and CMYK (4) are read'
    elif height == 0:
        problem = 'the height is defined by a DNL marker, which libjpeg does not read'
    # The entropy-coded data cannot contain FF D9 (0xFF is always stuffed or a marker), so the
    # end-of-image marker of a complete file lies after the first scan. Trailing bytes after it are
    # harmless; an end-of-image marker of an embedded thumbnail lies before the scan.
    truncation = None
    if data.rfind(b'\xff\xd9') < pos:
        truncation = f'no end-of-image marker after the image data; the file ends after {end} bytes'
    return _Header(height, width, orientation or 1, problem, truncation)


def _png_header(data: bytes) -> _Header:
    end = len(data)
    if end < 33:
        return _Header(0, 0, truncation=f'the file ends inside its header, after {end} bytes')
    if data[12:16] != b'IHDR':
        raise ValueError('the first chunk is not IHDR')
    width, height, depth, color = struct.unpack_from('>IIBB', data, 16)
    problem = None
    if depth not in (1, 2, 4, 8, 16) or color not in (0, 2, 3, 4, 6):
        problem = f'bit depth {depth}, colour type {color}'
    orientation, pos = 1, 8
    while True:  # walk the chunks to IEND (a few dozen hops for a photo)
        if pos + 8 > end:
            return _Header(height, width, orientation, problem,
                           f'the chunks run past the end of the file (no IEND); it ends after {end} bytes')
        length = struct.unpack_from('>I', data, pos)[0]
        kind = data[pos + 4:pos + 8]
        if kind == b'IEND':
            return _Header(height, width, orientation, problem)
        if kind == b'eXIf' and pos + 8 + length <= end:
            orientation = exif_orientation(data[pos + 8:pos + 8 + length])
        pos += 12 + length


def _gif_header(data: bytes) -> _Header:
    end = len(data)
    if end < 13:
        return _Header(0, 0, truncation=f'the file ends inside its header, after {end} bytes')
    width, height, flags = struct.unpack_from('<HHB', data, 6)
    pos = 13 + (3 << ((flags & 7) + 1) if flags & 0x80 else 0)
    truncated = _Header(height, width, truncation=f'its blocks run past the end of the file (no trailer); it '
                        f'ends after {end} bytes')
    images = 0
    while pos < end:  # walk the blocks to the trailer
        kind = data[pos]
        if kind == 0x3B:  # trailer
            if not images:
                raise ValueError('no image in the file')
            return _Header(height, width)
        if kind == 0x21:  # extension: label, then sub-blocks
            pos += 2
        elif kind == 0x2C:  # image descriptor, local colour table, LZW code size, then sub-blocks
            if pos + 10 > end:
                return truncated
            local = data[pos + 9]
            pos += 10 + (3 << ((local & 7) + 1) if local & 0x80 else 0) + 1
            images += 1
        else:
            raise ValueError(f'unknown GIF block 0x{kind:02x} at byte {pos}')
        while pos < end and data[pos]:  # data sub-blocks up to the zero-length terminator
            pos += 1 + data[pos]
        pos += 1
    return truncated


def _bmp_header(data: bytes) -> _Header:
    end = len(data)
    offset, dib = struct.unpack_from('<II', data, 10)
    if end < 18 + min(dib, 20):
        return _Header(0, 0, truncation=f'the file ends inside its header, after {end} bytes')
    if dib == 12:  # OS/2 BITMAPCOREHEADER
        width, height, _, bits = struct.unpack_from('<HHHH', data, 18)
        compression = 0
    else:
        width, height, _, bits, compression = struct.unpack_from('<iiHHI', data, 18)
    height = abs(height)  # negative: stored top-down
    problem = None
    if bits not in (1, 4, 8, 16, 24, 32) or width <= 0 or compression not in (0, 1, 2, 3):
        problem = f'{bits} bits per pixel, compression {compression}'
    needed = ((width * bits + 31) // 32) * 4 * height if compression in (0, 3) else 1
    truncation = None
    if offset + needed > end:
        truncation = f'the header declares {offset + needed} bytes, the file has {end}'
    return _Header(height, width, 1, problem, truncation)


def _webp_header(data: bytes) -> _Header:
    end = len(data)
    declared = 8 + struct.unpack_from('<I', data, 4)[0]
    truncation = None if end >= declared else f'the header declares {declared} bytes, the file has {end}'
    width = height = 0
    orientation, pos = 1, 12
    while pos + 8 <= min(end, declared):
        kind, length = data[pos:pos + 4], struct.unpack_from('<I', data, pos + 4)[0]
        body = pos + 8
        if kind == b'VP8X' and body + 10 <= end:
            width = 1 + int.from_bytes(data[body + 4:body + 7], 'little')
            height = 1 + int.from_bytes(data[body + 7:body + 10], 'little')
        elif kind == b'VP8 ' and not width and body + 10 <= end:
            width, height = (v & 0x3FFF for v in struct.unpack_from('<HH', data, body + 6))
        elif kind == b'VP8L' and not width and body + 5 <= end:
            bits = struct.unpack_from('<I', data, body + 1)[0]
            width, height = 1 + (bits & 0x3FFF), 1 + ((bits >> 14) & 0x3FFF)
        elif kind == b'EXIF' and body + length <= end:
            orientation = exif_orientation(data[body:body + length])
        pos = body + length + (length & 1)
    if not width and truncation is None:
        raise ValueError('no image chunk (VP8, VP8L or VP8X)')
    return _Header(height, width, orientation, None, truncation)


def _tiff_header(data: bytes) -> _Header:
    with warnings.catch_warnings():
        warnings.simplefilter('ignore', Image.DecompressionBombWarning)
        image = Image.open(io.BytesIO(data))  # reads the first directory only
    width, height = image.size  # Pillow applies the orientation tag while reading a TIFF
    tags = image.tag_v2
    problem = None
    if image.mode not in _PIL_8BIT_MODES:
        problem = f'mode {image.mode}; 8-bit gray, palette, RGB(A) and CMYK TIFFs are read'
    extent = 0
    for offsets, counts in ((273, 279), (324, 325)):  # strips, tiles
        if offsets in tags and counts in tags:
            ends = [o + c for o, c in zip(np.atleast_1d(tags[offsets]), np.atleast_1d(tags[counts]))]
            extent = int(max([extent] + ends))
    truncation = None if extent <= len(data) else f'the header declares {extent} bytes, the file has {len(data)}'
    return _Header(height, width, 1, problem, truncation)


_PARSERS = {'JPEG': _jpeg_header, 'PNG': _png_header, 'GIF': _gif_header, 'BMP': _bmp_header,
            'WEBP': _webp_header, 'TIFF': _tiff_header}


def inspect_image(data: bytes, path, max_pixels: Optional[int] = DEFAULT_MAX_PIXELS) -> ImageInfo:
    """Read the header and structure of the image file ``data`` (its bytes); decode nothing.

    Args:
        data (bytes): The whole file.
        path: The file's name, for messages.
        max_pixels (int, optional): Largest accepted ``height * width``. None: no limit. Defaults to
            :data:`DEFAULT_MAX_PIXELS`.

    Returns:
        ImageInfo: Format, displayed and stored size, EXIF orientation.

    Raises:
        ImageDecodeError: not an image, too large, unsupported mode or truncated (checked in this
            order: the first problem found is reported).
    """
    if not data:
        raise image_error(path, NOT_AN_IMAGE, 'the file is empty, 0 bytes')
    fmt = _sniff(data)
    if fmt is None:
        raise image_error(path, NOT_AN_IMAGE, f'no JPEG, PNG, GIF, BMP, WebP or TIFF signature; the file starts '
                          f'with {bytes(data[:12])!r}')
    try:
        header = _PARSERS[fmt](data)
    except Image.DecompressionBombError as err:  # Pillow's own limit (TIFF headers are read by Pillow)
        raise image_error(path, TOO_LARGE, str(err)) from None
    except (ValueError, struct.error, IndexError, OSError) as err:
        raise image_error(path, CORRUPT, f'{fmt} header not understood: {err}') from None
    height, width = header.height, header.width
    if max_pixels is not None and height * width > max_pixels:
        raise image_error(path, TOO_LARGE, f'the {fmt} header declares {width} x {height} = {width * height:,} pixels, '
                          f'more than max_pixels={max_pixels:,}')
    if header.mode_problem:
        raise image_error(path, UNSUPPORTED_MODE, f'{fmt} with {header.mode_problem}')
    if header.truncation:
        raise image_error(path, TRUNCATED, f'{fmt}: {header.truncation}')
    if height <= 0 or width <= 0:
        raise image_error(path, CORRUPT, f'the {fmt} header declares a {width} x {height} image')
    orientation = header.orientation
    shown = (width, height) if orientation in TRANSPOSING_ORIENTATIONS else (height, width)
    return ImageInfo(fmt, shown[0], shown[1], orientation, height, width)


def orient(img: np.ndarray, orientation: int) -> np.ndarray:
    """``img`` (rows, columns, ...) as displayed under EXIF ``orientation``: a view, no copy.

    1: as stored; 2: mirrored; 3: rotated 180; 4: flipped; 5: transposed; 6: rotated 90 clockwise;
    7: transversed; 8: rotated 90 counter-clockwise (``PIL.ImageOps.exif_transpose``'s mapping).
    """
    if orientation in (2, 3):
        img = img[:, ::-1]
    if orientation in (3, 4):
        img = img[::-1]
    if orientation in TRANSPOSING_ORIENTATIONS:
        img = img.swapaxes(0, 1)
        if orientation in (6, 7):
            img = img[:, ::-1]
        if orientation in (7, 8):
            img = img[::-1]
    return img


def decode_stored(data: bytes, path, info: ImageInfo, color_type: str = 'color', factor: int = 1,
                  backend: str = 'cv2') -> np.ndarray:
    """Decode a file :func:`inspect_image` accepted, in its stored orientation (apply :func:`orient`).

    Args:
        data (bytes): The file.
        path: Its name, for messages.
        info (ImageInfo): What :func:`inspect_image` returned for it.
        color_type (str): One of :data:`COLOR_TYPES` (mmcv's names). Defaults to 'color'.
        factor (int): 1, or 2, 4, 8 for a JPEG decoded at reduced size by OpenCV (``ceil(size /
            factor)``). Defaults to 1.
        backend (str): 'cv2' (OpenCV; GIF always goes to Pillow) or 'pillow'. Defaults to 'cv2'.

    Raises:
        ImageDecodeError: the decoder failed (corrupt, or truncated as Pillow reports it).
    """
    if info.format in _PILLOW_FORMATS or backend == 'pillow':
        if factor != 1:
            raise ValueError('reduced decoding needs OpenCV and a JPEG')
        return _decode_pillow(data, path, info, color_type)
    flag = COLOR_TYPES[color_type]
    if factor != 1:
        if info.format != 'JPEG' or flag != cv2.IMREAD_COLOR:
            raise ValueError('reduced decoding needs a JPEG and a colour decode')
        flag = REDUCED_FLAGS[factor]
    if flag != cv2.IMREAD_UNCHANGED:  # (UNCHANGED ignores the orientation by definition)
        flag |= cv2.IMREAD_IGNORE_ORIENTATION  # applied by the caller, the same way for every format
    img = cv2.imdecode(np.frombuffer(data, np.uint8), flag)
    if img is None:
        raise image_error(path, CORRUPT, f'{info.format} data that OpenCV cannot decode')
    return img


def _decode_pillow(data: bytes, path, info: ImageInfo, color_type: str) -> np.ndarray:
    with warnings.catch_warnings():
        warnings.simplefilter('ignore', Image.DecompressionBombWarning)
        try:
            image = Image.open(io.BytesIO(data))
            image.load()
        except Image.DecompressionBombError as err:
            raise image_error(path, TOO_LARGE, str(err)) from None
        except (OSError, SyntaxError, ValueError) as err:
            reason = TRUNCATED if 'truncated' in str(err) else CORRUPT
            raise image_error(path, reason, f'{info.format} data that Pillow cannot decode: {err}') from None
    if color_type == 'unchanged':
        return _rgb_to_bgr(np.asarray(image))
    if info.format == 'TIFF' and not color_type.endswith('_ignore_orientation'):
        from PIL import ImageOps
        image = ImageOps.exif_transpose(image)  # a no-op where Pillow applied it while reading
    if image.mode in _PIL_16BIT_MODES:  # the high byte, as OpenCV / libpng reduce 16-bit samples
        image = Image.fromarray((np.asarray(image, dtype=np.uint16) >> 8).astype(np.uint8), 'L')
    elif image.mode not in _PIL_8BIT_MODES:
        raise image_error(path, UNSUPPORTED_MODE, f'{info.format} in mode {image.mode}')
    if color_type.startswith('grayscale'):
        return np.asarray(image.convert('L'))
    return np.ascontiguousarray(np.asarray(image.convert('RGB'))[..., ::-1])


def _rgb_to_bgr(array: np.ndarray) -> np.ndarray:
    if array.ndim == 3 and array.shape[2] >= 3:
        array = array.copy()
        array[..., :3] = array[..., 2::-1]
    return array


def decode_image(data: bytes, path, color_type: str = 'color', backend: str = 'cv2',
                 max_pixels: Optional[int] = DEFAULT_MAX_PIXELS) -> np.ndarray:
    """Check and decode an image file (see the module docstring for what is checked and the pixels).

    Args:
        data (bytes): The whole file.
        path: The file's name, for messages.
        color_type (str): 'color' (BGR uint8 HxWx3, EXIF orientation applied), 'grayscale',
            'unchanged' (as stored: channels, depth and orientation), 'color_ignore_orientation' or
            'grayscale_ignore_orientation'. Defaults to 'color'.
        backend (str): 'cv2' or 'pillow'. Defaults to 'cv2'.
        max_pixels (int, optional): Largest accepted height x width. Defaults to
            :data:`DEFAULT_MAX_PIXELS`; None: no limit.

    Returns:
        np.ndarray: The pixels.

    Raises:
        ImageDecodeError: names the file and the reason (truncated, not an image, unsupported mode,
            too large, corrupt).
    """
    if color_type not in COLOR_TYPES:
        raise ValueError(f'color_type must be one of {sorted(COLOR_TYPES)}, got {color_type!r}')
    if backend not in BACKENDS:
        raise ValueError(f'backend must be one of {BACKENDS}, got {backend!r}')
    info = inspect_image(data, path, max_pixels)
    img = decode_stored(data, path, info, color_type, backend=backend)
    if color_type in ('color', 'grayscale') and info.orientation != 1:
        img = np.ascontiguousarray(orient(img, info.orientation))
    return img


def reduced_shape(info: ImageInfo, factor: int) -> Tuple[int, int]:
    """The stored (height, width) OpenCV gives for a JPEG decoded at 1/``factor``."""
    return math.ceil(info.stored_height / factor), math.ceil(info.stored_width / factor)
