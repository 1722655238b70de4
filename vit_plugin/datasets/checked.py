"""mmpretrain's datasets for the paper's data, checked when built (docs/configs.md#data-preparation).

Registered as ``vit_plugin.<name>`` for ImageNet, ImageNet21k, CIFAR10, CIFAR100, OxfordIIITPet, Flowers102
and CustomDataset: a missing path raises :class:`DataRootNotFoundError`, no sample :class:`NoSamplesError`,
a label outside ``[0, num_classes)`` :class:`~vit_plugin.datasets.compact_index.ListFileError`.
``vit_plugin.ImageNet21k`` reads a list file through :mod:`vit_plugin.datasets.compact_index`.
"""
import os.path as osp
from typing import List, Optional, Union

import numpy as np
from mmpretrain import datasets as mmpretrain_datasets

from vit_plugin.compat import mmengine as mmengine_compat
from vit_plugin.datasets.compact_index import CompactListMixin, ListFileError
from vit_plugin.datasets.indexed import check_label_range
from vit_plugin.datasets.decode import ImageDecodeError
from vit_plugin.registry import DATASETS

README_SECTION = "README.md, section 'Data preparation' (#data-preparation)"


class DataRootNotFoundError(FileNotFoundError):
    """A dataset's root, annotation file or image folder does not exist."""


class NoSamplesError(ValueError):
    """A dataset whose files give no sample."""


def _prefix(data_prefix: Union[str, dict]) -> str:
    if isinstance(data_prefix, dict):
        return data_prefix.get('img_path', '')
    return data_prefix or ''


def _join(data_root: str, path: str) -> str:
    return path if (not data_root or osp.isabs(path)) else osp.join(data_root, path)


def _folder_or_list(data_root, split, kwargs) -> List[str]:
    # ImageNet / ImageNet-21k / CustomDataset: a list file and the image folder when an ann_file is
    # given; otherwise the image folder (one sub-folder per class). mmpretrain's ImageNet and
    # ImageNet21k use ``split`` as the default image folder and ``meta/<split>.txt`` when it exists.
    prefix = _prefix(kwargs.get('data_prefix', '')) or split or ''
    paths = [_join(data_root, prefix)] if prefix else []
    if kwargs.get('ann_file'):
        paths.append(_join(data_root, kwargs['ann_file']))
    return paths


def _cifar(data_root, split, kwargs) -> List[str]:
    # mmpretrain downloads CIFAR into data_root when ``download=True`` (its default); only an
    # offline configuration (download=False) needs the files to be there already.
    return [] if kwargs.get('download', True) else [osp.join(data_root, kwargs.get('data_prefix') or '')]


def _pets(data_root, split, kwargs) -> List[str]:
    return [osp.join(data_root, 'images'), osp.join(data_root, 'annotations', f'{split}.txt')]


def _flowers(data_root, split, kwargs) -> List[str]:
    return [osp.join(data_root, name) for name in ('jpg', 'imagelabels.mat', 'setid.mat')]


def check_dataset_paths(name: str, paths: List[str], layout: str) -> None:
    """Raise :class:`DataRootNotFoundError` for the first path in ``paths`` that does not exist.

    Args:
        name (str): Dataset name for the message.
        paths (list[str]): Files or folders the dataset will read.
        layout (str): The expected layout, shown to the user.
    """
    for path in paths:
        if path and not osp.exists(path):
            raise DataRootNotFoundError(
                f'{name}: {osp.abspath(path)!r} does not exist. Expected layout: {layout}. Prepare the '
                f'data ({README_SECTION}), or point the config at your copy: `--cfg-options '
                f'train_dataloader.dataset.data_root=... val_dataloader.dataset.data_root=...`.')


def _source(dataset) -> str:
    """The list file, or else the image folder, a dataset reads (for messages)."""
    ann_file = getattr(dataset, 'ann_file', '')
    if ann_file:
        return osp.abspath(ann_file)
    return osp.abspath(getattr(dataset, 'img_prefix', '') or getattr(dataset, 'data_root', '') or '.')


def _no_samples(dataset, name: str) -> NoSamplesError:
    indices = mmengine_compat.dataset_indices(dataset)
    return NoSamplesError(
        f'{name}: {_source(dataset)} gives no samples' + (f' (after indices={indices!r})' if indices is not None
                                                          else '')
        + f'; check the file and the data root, see {README_SECTION}.')


def check_samples(dataset, name: str) -> None:
    """Raise when ``dataset`` (fully initialised) has no sample, or, when its ``num_classes`` is set,
    a label outside ``[0, num_classes)`` (list files through the compact index are checked there,
    naming the line)."""
    if len(dataset) == 0:
        raise _no_samples(dataset, name)
    num_classes = getattr(dataset, 'num_classes', None)
    if num_classes is None or getattr(dataset, '_index', None) is not None:
        return
    labels = np.asarray(dataset.get_gt_labels())
    check_label_range(labels, num_classes, lambda i: f'{name}: sample {i} '
                      f'({dataset.get_data_info(i).get("img_path")}) of {_source(dataset)}', ListFileError)


def _make_checked(cls: type) -> type:
    """Class decorator: give an mmpretrain dataset class the checks of this module, and ``num_classes``.

    The checks are methods of ``cls`` itself, so they run before those of every base
    (:class:`~vit_plugin.datasets.compact_index.CompactListMixin`'s ``full_init`` does not call the next one).
    ``cls`` sets ``data_layout`` (shown to the user), ``data_paths`` (``(data_root, split, kwargs) -> paths``
    to check) and, where mmpretrain's class has one, ``default_split``.
    """
    name = cls.__name__

    def __init__(self, *args, num_classes: Optional[int] = None, **kwargs):
        if args:  # mmpretrain's classes take data_root (and split) first
            kwargs.update(zip(('data_root', 'split'), args))
        if num_classes is not None and (not isinstance(num_classes, int) or isinstance(num_classes, bool)
                                        or num_classes < 1):
            raise ValueError(f'{name}: num_classes must be a positive int, got {num_classes!r}')
        self.num_classes = num_classes
        data_root = kwargs.get('data_root', '')
        split = kwargs.get('split', getattr(cls, 'default_split', ''))
        paths = ([data_root] if data_root else []) + cls.data_paths(data_root, split, kwargs)
        check_dataset_paths(name, paths, cls.data_layout)
        super(cls, self).__init__(**kwargs)

    def full_init(self):
        if self._fully_initialized:
            return
        super(cls, self).full_init()
        check_samples(self, name)

    def _serialize_data(self):  # mmengine's packing fails on an empty list, without a word about the file
        if not self.data_list:
            raise _no_samples(self, name)
        return super(cls, self)._serialize_data()

    def prepare_data(self, idx):  # a bad image named by a list file: the advice names the list
        try:
            return super(cls, self).prepare_data(idx)
        except ImageDecodeError as err:
            if not getattr(self, 'ann_file', ''):
                raise
            raise err.for_source('list', osp.abspath(self.ann_file)) from None

    for method in (__init__, full_init, _serialize_data, prepare_data):
        method.__qualname__ = f'{cls.__qualname__}.{method.__name__}'
        setattr(cls, method.__name__, method)
    return cls


@DATASETS.register_module()
@_make_checked
class ImageNet(mmpretrain_datasets.ImageNet):
    """mmpretrain's ``ImageNet`` with the checks of :func:`_make_checked`."""
    data_layout = ('<data_root>/{train,val}/... images and <data_root>/meta/{train,val}.txt, or class '
                   'sub-folders <data_root>/train/<wnid>/*.JPEG')
    data_paths = staticmethod(_folder_or_list)


@DATASETS.register_module()
@_make_checked
class ImageNet21k(CompactListMixin, mmpretrain_datasets.ImageNet21k):
    """mmpretrain's ``ImageNet21k`` with the checks of :func:`_make_checked`.

    A list file is served from an array-backed index cached as ``<ann_file>.index``
    (``index_cache=False``: not cached); see :mod:`vit_plugin.datasets.compact_index`.
    """
    data_layout = ('<data_root>/meta/train.txt ("<relative path> <label>" per line) with images under '
                   '<data_root>/<data_prefix>, or class sub-folders <data_root>/train/<wnid>/*.JPEG')
    data_paths = staticmethod(_folder_or_list)


@DATASETS.register_module()
@_make_checked
class CustomDataset(mmpretrain_datasets.CustomDataset):
    """mmpretrain's ``CustomDataset`` with the checks of :func:`_make_checked`."""
    data_layout = 'class sub-folders <data_root>/<data_prefix>/<class>/*.png, or a list file'
    data_paths = staticmethod(_folder_or_list)


@DATASETS.register_module()
@_make_checked
class CIFAR10(mmpretrain_datasets.CIFAR10):
    """mmpretrain's ``CIFAR10`` with the checks of :func:`_make_checked`."""
    data_layout = '<data_root>/cifar-10-batches-py/ (the python version)'
    data_paths = staticmethod(_cifar)


@DATASETS.register_module()
@_make_checked
class CIFAR100(mmpretrain_datasets.CIFAR100):
    """mmpretrain's ``CIFAR100`` with the checks of :func:`_make_checked`."""
    data_layout = '<data_root>/cifar-100-python/ (the python version)'
    data_paths = staticmethod(_cifar)


@DATASETS.register_module()
@_make_checked
class OxfordIIITPet(mmpretrain_datasets.OxfordIIITPet):
    """mmpretrain's ``OxfordIIITPet`` with the checks of :func:`_make_checked`."""
    data_layout = '<data_root>/images/*.jpg and <data_root>/annotations/{trainval,test}.txt'
    data_paths = staticmethod(_pets)
    default_split = 'trainval'


@DATASETS.register_module()
@_make_checked
class Flowers102(mmpretrain_datasets.Flowers102):
    """mmpretrain's ``Flowers102`` with the checks of :func:`_make_checked`."""
    data_layout = '<data_root>/jpg/*.jpg, <data_root>/imagelabels.mat, <data_root>/setid.mat'
    data_paths = staticmethod(_flowers)
    default_split = 'trainval'


__all__ = ['DataRootNotFoundError', 'NoSamplesError', 'check_dataset_paths',
           'check_samples', 'README_SECTION', 'ImageNet', 'ImageNet21k', 'CustomDataset', 'CIFAR10', 'CIFAR100',
           'OxfordIIITPet', 'Flowers102']
