"""A corpus of broken and unusual image files, generated (nothing binary is stored), and what every
loader must make of each: the reference pixels, or an error with a given reason.

The reference of a valid file is Pillow's ``ImageOps.exif_transpose(img).convert('RGB')``, reversed to
BGR, with the documented exceptions: a 16-bit grayscale PNG keeps the high byte of each sample (Pillow's
``convert`` clips at 255 instead), and OpenCV rounds CMYK-to-RGB differently from Pillow (within 1).
"""
import io
import os
import os.path as osp
import struct
import zlib
from typing import Dict, NamedTuple, Optional

import cv2
import numpy as np
from PIL import Image, ImageOps


class Case(NamedTuple):
    path: str
    reason: Optional[str]  # the ImageDecodeError reason, or None for a valid file
    reference: Optional[np.ndarray]  # BGR uint8 reference pixels of a valid file
    cv2_tolerance: int = 0  # largest |OpenCV - reference| allowed (CMYK)
    note: str = ''


def photo(height: int = 60, width: int = 80, seed: int = 0) -> np.ndarray:
    """A smooth RGB test image with some texture (JPEG-friendly, every channel different)."""
    y, x = np.mgrid[0:height, 0:width]
    img = np.stack([x * 255 / width, y * 255 / height, (x + 2 * y) * 255 / (width + 2 * height)], -1)
    img = img + np.random.default_rng(seed).integers(-12, 12, img.shape)
    return img.clip(0, 255).astype(np.uint8)


def encode(image: Image.Image, fmt: str, **kwargs) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, fmt, **kwargs)
    return buffer.getvalue()


def reference(data: bytes) -> np.ndarray:
    """Pillow's reading: ``exif_transpose`` + ``convert('RGB')``, as BGR."""
    with Image.open(io.BytesIO(data)) as image:
        return np.ascontiguousarray(np.asarray(ImageOps.exif_transpose(image).convert('RGB'))[..., ::-1])


def _png_chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack('>I', len(body)) + kind + body + struct.pack('>I', zlib.crc32(kind + body))


def png_bomb(width: int = 100_000, height: int = 100_000) -> bytes:
    """A 1 KB PNG whose header declares ``width`` x ``height`` RGB pixels (30 GB as decoded)."""
    header = struct.pack('>IIBBBBB', width, height, 8, 2, 0, 0, 0)
    return (b'\x89PNG\r\n\x1a\n' + _png_chunk(b'IHDR', header)
            + _png_chunk(b'IDAT', zlib.compress(b'\x00' * 4096)) + _png_chunk(b'IEND', b''))


def with_app1_segments(jpeg: bytes, *payloads: bytes) -> bytes:
    """``jpeg`` with APP1 segments inserted right after its SOI marker."""
    segments = b''.join(b'\xff\xe1' + struct.pack('>H', len(p) + 2) + p for p in payloads)
    return jpeg[:2] + segments + jpeg[2:]


def exif(orientation: int) -> bytes:
    data = Image.Exif()
    data[0x0112] = orientation
    return data.tobytes()


def set_jpeg_precision(jpeg: bytes, bits: int) -> bytes:
    data = bytearray(jpeg)
    sof = data.index(b'\xff\xc0')
    data[sof + 4] = bits
    return bytes(data)


def write_corpus(folder: str) -> Dict[str, Case]:
    """Write the corpus into ``folder``; returns name -> :class:`Case`."""
    os.makedirs(folder, exist_ok=True)
    rgb = Image.fromarray(photo())
    jpeg = encode(rgb, 'JPEG', quality=90)
    cases = {}

    def add(name, data, reason=None, ref=None, tolerance=0, note=''):
        path = osp.join(folder, name)
        with open(path, 'wb') as f:
            f.write(data)
        if reason is None and ref is None:
            ref = reference(data)
        cases[name] = Case(path, reason, ref, tolerance, note)

    add('zero_bytes.jpg', b'', 'not an image')
    for percent in (10, 50, 99):
        add(f'truncated_{percent}.jpg', jpeg[:len(jpeg) * percent // 100], 'truncated')
    # A cut file padded with zeros to its size (a preallocated download that stopped): for this noisy
    # image libjpeg decodes the zeros as image data and OpenCV returns an image with garbage rows.
    noise = encode(Image.fromarray(np.random.default_rng(3).integers(0, 256, (60, 80, 3), dtype=np.uint8)), 'JPEG',
                   quality=90)
    cut = noise[:len(noise) // 2]
    add('truncated_50_zero_padded.jpg', cut + bytes(len(noise) - len(cut)), 'truncated',
        note='OpenCV returns an image')
    add('png_named.jpg', encode(rgb, 'PNG'))
    add('gif_named.jpg', encode(rgb.convert('P'), 'GIF'), note='OpenCV cannot read GIF')
    add('cmyk.jpg', encode(rgb.convert('CMYK'), 'JPEG', quality=90), tolerance=1,
        note='OpenCV rounds CMYK->RGB differently (<= 1)')
    add('grayscale.jpg', encode(rgb.convert('L'), 'JPEG', quality=90))
    gray16 = (np.asarray(rgb.convert('L')).astype(np.uint16) * 257
              + np.random.default_rng(1).integers(0, 200, (60, 80))).astype(np.uint16)
    add('gray_16bit.png', cv2.imencode('.png', gray16)[1].tobytes(),
        ref=np.repeat((gray16 >> 8).astype(np.uint8)[..., None], 3, axis=2),
        note="reference: the high byte (Pillow's convert clips 16-bit gray at 255)")
    rgb16 = (np.asarray(rgb).astype(np.uint16) * 257 + np.random.default_rng(2).integers(0, 200, (60, 80, 3)))
    add('rgb_16bit.png', cv2.imencode('.png', rgb16.astype(np.uint16)[..., ::-1])[1].tobytes())
    add('paletted.png', encode(rgb.convert('P', palette=Image.Palette.ADAPTIVE, colors=32), 'PNG'))
    add('paletted_transparent.png', encode(rgb.convert('P'), 'PNG', transparency=0))
    for orientation in range(1, 9):
        add(f'orientation_{orientation}.jpg', encode(rgb.crop((0, 0, 77, 59)), 'JPEG', quality=90,
                                                     exif=exif(orientation)))
    # The Exif segment after an XMP one: Pillow applies it; OpenCV (mmcv's loader) reads only the first
    # APP1 segment and does not rotate.
    xmp = b'http://ns.adobe.com/xap/1.0/\x00<x:xmpmeta xmlns:x="adobe:ns:meta/"/>'
    add('orientation_6_after_xmp.jpg', with_app1_segments(encode(rgb.crop((0, 0, 77, 59)), 'JPEG', quality=90),
                                                          xmp, exif(6)),
        note='mmcv/OpenCV leave it unrotated')
    add('header_100000x100000.png', png_bomb(), 'too large')
    add('header_65500x65500.jpg', jpeg[:jpeg.index(b'\xff\xc0') + 5] + struct.pack('>HH', 65500, 65500)
        + jpeg[jpeg.index(b'\xff\xc0') + 9:], 'too large')
    add('text.JPEG', b'<html><body>404 Not Found</body></html>\n', 'not an image')
    add('12bit.jpg', set_jpeg_precision(jpeg, 12), 'unsupported mode')
    add('caf\u00e9 \u6771\u4eac.jpg', jpeg)  # a non-ASCII path
    add('\u00fcbel_truncated.jpg', jpeg[:len(jpeg) // 3], 'truncated')
    return cases
