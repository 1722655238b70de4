"""Image decoding (``vit_plugin.datasets.decode``): a generated corpus of broken and unusual files
(helpers/bad_images.py) through every loader; each file gives Pillow's reference pixels or an
``ImageDecodeError`` with the expected reason."""
import cv2
import numpy as np
import pytest
from mmengine.registry import init_default_scope
from PIL import Image, ImageFile

from helpers.bad_images import encode, photo, reference
from helpers.common import read_bytes
from vit_plugin.datasets import decode
from vit_plugin.datasets.decode import ImageDecodeError, decode_image
from vit_plugin.datasets.transforms import LoadAndInceptionCrop, LoadImageFromFile


@pytest.fixture(scope='module', autouse=True)
def mmpretrain_scope():
    init_default_scope('mmpretrain')


def whole_image_crop(path, shape):
    """LoadAndInceptionCrop set to take the whole image at its own size (so the output is the decode)."""
    height, width = shape[:2] if shape is not None else (8, 8)
    return LoadAndInceptionCrop(scale=(height, width), crop_ratio_range=(1.0, 1.0),
                                aspect_ratio_range=(width / height, width / height),
                                interpolation='nearest')(dict(img_path=path))['img']


def infer_reader(path, shape):
    from vit_plugin.inference import read_image
    return read_image(path)


#: name -> (function(path, expected shape) -> BGR pixels, uses OpenCV for JPEG/PNG)
LOADERS = {
    'decode_image': (lambda path, shape: decode_image(read_bytes(path), path), True),
    'decode_image(pillow)': (lambda path, shape: decode_image(read_bytes(path), path, backend='pillow'), False),
    'vit_plugin.LoadImageFromFile': (lambda path, shape: LoadImageFromFile()(dict(img_path=path))['img'], True),
    'vit_plugin.LoadImageFromFile(pillow)': (
        lambda path, shape: LoadImageFromFile(imdecode_backend='pillow')(dict(img_path=path))['img'], False),
    'LoadAndInceptionCrop': (whole_image_crop, True),
    'tools/infer.py': (infer_reader, True),
}


@pytest.mark.parametrize('loader', sorted(LOADERS))
def test_every_corpus_file_gives_reference_pixels_or_a_named_error(corpus, loader):
    load, uses_opencv = LOADERS[loader]
    assert len(corpus) == 28
    for name, case in corpus.items():
        if case.reason is not None:
            with pytest.raises(ImageDecodeError) as err:
                load(case.path, None)
            assert err.value.reason == case.reason, (loader, name, str(err.value))
            assert str(err.value).startswith(f'{case.path}: {case.reason} ('), (loader, name)
            assert err.value.path == case.path
            continue
        got = load(case.path, case.reference.shape)
        assert got.dtype == np.uint8 and got.shape == case.reference.shape, (loader, name, got.shape)
        diff = int(np.abs(got.astype(int) - case.reference).max())
        tolerance = case.cv2_tolerance if uses_opencv else 0
        assert diff <= tolerance, (loader, name, diff)


def test_corpus_differences_are_the_documented_ones(corpus):
    # What the tolerances and the special references stand for, measured on the files themselves.
    cmyk = corpus['cmyk.jpg']
    ours = decode_image(read_bytes(cmyk.path), cmyk.path)
    assert np.abs(ours.astype(int) - cmyk.reference).max() == 1  # OpenCV's rounding, not a bug of ours
    gray16 = corpus['gray_16bit.png']
    assert np.abs(reference(read_bytes(gray16.path)).astype(int) - gray16.reference).max() > 100  # Pillow clips
    # mmcv's loader (OpenCV) ignores an Exif segment that follows another APP1 segment; ours applies it
    from mmcv.transforms import LoadImageFromFile as MMCVLoadImageFromFile
    xmp = corpus['orientation_6_after_xmp.jpg']
    assert MMCVLoadImageFromFile()(dict(img_path=xmp.path))['img'].shape == (59, 77, 3)
    assert xmp.reference.shape == (77, 59, 3)
    # and the partial decode this module exists for: OpenCV returns pixels for a zero-padded cut file
    padded = corpus['truncated_50_zero_padded.jpg']
    assert cv2.imdecode(np.frombuffer(read_bytes(padded.path), np.uint8), cv2.IMREAD_COLOR) is not None


@pytest.mark.parametrize('fmt,kwargs', [('BMP', {}), ('WEBP', dict(lossless=True)), ('WEBP', dict(quality=90)),
                                        ('TIFF', {}), ('PNG', {})])
def test_other_formats_give_reference_pixels_orientation_included_and_truncation_is_found(fmt, kwargs):
    from helpers.bad_images import exif
    image = Image.fromarray(photo(30, 44))
    for orientation in ((1, 6) if fmt != 'BMP' else (1, )):
        extra = dict(exif=exif(orientation)) if orientation != 1 else {}
        data = encode(image, fmt, **kwargs, **extra)
        want = reference(data)
        assert want.shape == ((44, 30, 3) if orientation == 6 else (30, 44, 3))
        for backend in ('cv2', 'pillow'):
            np.testing.assert_array_equal(decode_image(data, 'x', backend=backend), want, err_msg=f'{fmt} {backend}')
        with pytest.raises(ImageDecodeError, match=rf'^y: truncated \({fmt}: ') as err:
            decode_image(data[:-7], 'y')
        assert err.value.reason == 'truncated'


def test_a_float_tiff_is_an_unsupported_mode():
    data = encode(Image.fromarray(np.linspace(0, 1, 300, dtype=np.float32).reshape(15, 20)), 'TIFF')
    with pytest.raises(ImageDecodeError, match=r'^f\.tif: unsupported mode \(TIFF with mode F'):
        decode_image(data, 'f.tif')


def test_truncation_is_caught_even_when_pillow_loads_truncated_images(corpus, monkeypatch):
    monkeypatch.setattr(ImageFile, 'LOAD_TRUNCATED_IMAGES', True)
    case = corpus['truncated_99.jpg']
    with Image.open(case.path) as image:
        image.load()  # Pillow now fills the rest with grey
    with pytest.raises(ImageDecodeError, match='truncated'):
        decode_image(read_bytes(case.path), case.path, backend='pillow')


def test_pixel_limit_is_configurable_and_checked_before_decoding(tmp_path, monkeypatch):
    path = str(tmp_path / 'photo.jpg')
    with open(path, 'wb') as f:
        f.write(encode(Image.fromarray(photo(60, 80)), 'JPEG', quality=90))

    def no_decode(*args, **kwargs):
        raise AssertionError('decoded a file over the limit')

    monkeypatch.setattr(cv2, 'imdecode', no_decode)
    for loader in (LoadImageFromFile(max_pixels=4799), LoadAndInceptionCrop(16, max_pixels=4799)):
        with pytest.raises(ImageDecodeError, match=r'too large \(the JPEG header declares 80 x 60 = 4,800 pixels, '
                                                   r'more than max_pixels=4,799\)'):
            loader(dict(img_path=path))
    monkeypatch.undo()
    assert LoadImageFromFile(max_pixels=4800)(dict(img_path=path))['img'].shape == (60, 80, 3)
    assert LoadImageFromFile(max_pixels=None)(dict(img_path=path))['img'].shape == (60, 80, 3)
    assert decode.DEFAULT_MAX_PIXELS == 2 * Image.MAX_IMAGE_PIXELS  # Pillow's own refusal threshold
    with pytest.raises(ValueError, match=r'ignore_empty=True\) would replace unreadable files'):
        LoadImageFromFile(ignore_empty=True)


def test_decode_errors_survive_pickling_through_workers():
    import pickle
    err = decode.image_error('/data/x.JPEG', decode.TRUNCATED, 'JPEG: no end-of-image marker')
    again = pickle.loads(pickle.dumps(err))
    assert (again.path, again.reason, again.detail, str(again)) == (err.path, err.reason, err.detail, str(err))
    assert type(err)(str(err)).args == err.args  # how torch re-raises a worker's exception


def test_a_bad_file_gets_the_advice_of_its_dataset(tmp_path):
    """A file that is no image, named by a list file and found in a folder: the list's advice names the list
    file, the folder's says to delete or replace it."""
    from vit_plugin.datasets.checked import CustomDataset
    for name in ('a', 'b'):
        (tmp_path / 'train' / name).mkdir(parents=True)
    (tmp_path / 'train' / 'a' / 'good.png').write_bytes(encode(Image.fromarray(photo(8, 8)), 'PNG'))
    (tmp_path / 'train' / 'b' / 'bad.png').write_bytes(b'<html>no image</html>')
    (tmp_path / 'train.txt').write_text('a/good.png 0\nb/bad.png 1\n')
    pipeline = [dict(type='vit_plugin.LoadImageFromFile'), dict(type='PackInputs')]
    listed = CustomDataset(data_root=str(tmp_path), ann_file='train.txt', data_prefix='train', pipeline=pipeline)
    with pytest.raises(ImageDecodeError) as err:
        listed[1]
    assert f"remove its line from {tmp_path / 'train.txt'}" in str(err.value)
    folder = CustomDataset(data_root=str(tmp_path), data_prefix='train', pipeline=pipeline)
    bad = [i for i in range(len(folder)) if folder.get_data_info(i)['img_path'].endswith('bad.png')][0]
    with pytest.raises(ImageDecodeError) as err:
        folder[bad]
    assert 'replace it with the image, or delete it' in str(err.value) and 'list' not in str(err.value)
