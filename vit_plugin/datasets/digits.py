"""The embedded demo dataset: scikit-learn's bundled handwritten digits as an image-folder dataset.

scikit-learn ships the 1,797 8x8 grey-level digits of the UCI "optical recognition of handwritten
digits" set inside its wheel, so the demo needs no download at run time. :func:`prepare_digits_dataset`
writes them as PNG files in mmpretrain's ``CustomDataset`` folder layout::

    data_root/
        train/0/0000.png ... train/9/....png   (80 %, stratified by class)
        test/0/....png   ... test/9/....png    (20 %)
        meta.json                              (written last: marks a complete preparation)

:class:`DigitsDataset` (``type='vit_plugin.DigitsDataset'``) reads that layout and prepares it on
first use, so ``make demo`` and the tests work from a fresh checkout.
"""
import json
import os
import os.path as osp
import shutil
import tempfile
from typing import Optional

import numpy as np
from mmpretrain.datasets import CustomDataset

from vit_plugin.datasets.checked import check_samples
from vit_plugin.registry import DATASETS

#: Bump when the written files change, so that an old preparation is rebuilt instead of reused.
FORMAT_VERSION = 1
SPLITS = ('train', 'test')
TEST_FRACTION = 0.2
SPLIT_SEED = 0


def _expected_meta(img_size: int) -> dict:
    return dict(format_version=FORMAT_VERSION, img_size=img_size, test_fraction=TEST_FRACTION,
                split_seed=SPLIT_SEED)


def _read_meta(data_root: str):
    try:
        with open(osp.join(data_root, 'meta.json')) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _is_prepared(data_root: str, img_size: int) -> bool:
    meta = _read_meta(data_root)
    expected = _expected_meta(img_size)
    return isinstance(meta, dict) and all(meta.get(k) == v for k, v in expected.items())


def _stratified_split(labels: np.ndarray):
    """Deterministic per-class split (a fixed seed), without depending on scikit-learn's splitter."""
    rng = np.random.RandomState(SPLIT_SEED)
    train, test = [], []
    for cls in np.unique(labels):
        idx = rng.permutation(np.flatnonzero(labels == cls))
        n_test = int(round(len(idx) * TEST_FRACTION))
        test.extend(idx[:n_test].tolist())
        train.extend(idx[n_test:].tolist())
    return sorted(train), sorted(test)


def prepare_digits_dataset(data_root: str = 'data/digits', img_size: int = 32) -> str:
    """Write scikit-learn's handwritten digits as PNGs in mmpretrain's folder layout (idempotent).

    The 8x8 images (values 0..16) are scaled to 0..255 and enlarged to ``img_size`` with bicubic
    resampling, so that a ViT with a small patch size sees a patch grid rather than single pixels.
    Output is deterministic: the same call always writes byte-identical files. A complete
    preparation with the same settings is reused; an incomplete or different one is replaced. The
    files are written into a temporary directory next to ``data_root`` and moved into place at the
    end, so an interrupted run or a concurrent process never leaves a half-written dataset behind.

    Args:
        data_root (str): Where to write the dataset. Defaults to 'data/digits'.
        img_size (int): Side of the written square images in pixels. Defaults to 32.

    Returns:
        str: ``data_root``.
    """
    if not isinstance(img_size, int) or img_size < 8:
        raise ValueError(f'img_size must be an integer >= 8 (the digits are 8x8), got {img_size!r}')
    if _is_prepared(data_root, img_size):
        return data_root
    try:
        from sklearn.datasets import load_digits
    except ImportError as err:
        raise ImportError('The demo dataset comes from scikit-learn, which is not installed; install it '
                          'with `pip install scikit-learn` (it is part of requirements/tests.txt).') from err
    from PIL import Image

    digits = load_digits()
    images = np.round(digits.images * (255. / 16.)).astype(np.uint8)
    labels = digits.target.astype(int)
    train_idx, test_idx = _stratified_split(labels)

    parent = osp.dirname(osp.abspath(data_root))
    os.makedirs(parent, exist_ok=True)
    tmp_root = tempfile.mkdtemp(prefix='.digits-', dir=parent)
    try:
        for split, indices in zip(SPLITS, (train_idx, test_idx)):
            for cls in range(10):
                os.makedirs(osp.join(tmp_root, split, str(cls)))
            for i in indices:
                img = Image.fromarray(images[i], mode='L').resize((img_size, img_size), Image.BICUBIC)
                img.save(osp.join(tmp_root, split, str(labels[i]), f'{i:04d}.png'))
        meta = dict(_expected_meta(img_size), num_train=len(train_idx), num_test=len(test_idx),
                    source='sklearn.datasets.load_digits')
        with open(osp.join(tmp_root, 'meta.json'), 'w') as f:
            json.dump(meta, f, indent=1, sort_keys=True)
        if _is_prepared(data_root, img_size):  # another process finished first
            return data_root
        if osp.lexists(data_root):
            shutil.rmtree(data_root)
        os.replace(tmp_root, data_root)
    finally:
        if osp.isdir(tmp_root):
            shutil.rmtree(tmp_root, ignore_errors=True)
    return data_root


@DATASETS.register_module()
class DigitsDataset(CustomDataset):
    """The demo dataset (handwritten digits, 10 classes), prepared automatically on first use.

    Args:
        data_root (str): Root of the folder layout written by :func:`prepare_digits_dataset`.
            Defaults to 'data/digits'.
        split (str): 'train' (1,438 images) or 'test' (359 images). Defaults to 'train'.
        img_size (int): Image side used when the data has to be prepared. Defaults to 32.
        num_classes (int, optional): Check every label against it when the dataset is built (see
            :func:`vit_plugin.datasets.checked.check_samples`). Defaults to None.
        **kwargs: Other arguments of mmpretrain's ``CustomDataset`` (``pipeline``, ``test_mode``...).
    """
    METAINFO = dict(classes=tuple(str(i) for i in range(10)))

    def __init__(self, data_root: str = 'data/digits', split: str = 'train', img_size: int = 32,
                 num_classes: Optional[int] = None, **kwargs):
        if split not in SPLITS:
            raise ValueError(f'split must be one of {SPLITS}, got {split!r}')
        self.num_classes = num_classes
        prepare_digits_dataset(data_root, img_size)
        kwargs.setdefault('test_mode', split == 'test')
        super().__init__(data_root=data_root, data_prefix=split, **kwargs)

    def full_init(self):
        if self._fully_initialized:
            return
        super().full_init()
        check_samples(self, type(self).__name__)
