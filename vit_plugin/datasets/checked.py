"""mmpretrain's datasets for the paper's data, with a clear error when the data is not there.

Without a check, a wrong ``data_root`` surfaces as an ``AssertionError`` or ``FileNotFoundError``
from deep inside a loader, often only after the model was built. The classes here (registered as
``vit_plugin.ImageNet``, ``vit_plugin.ImageNet21k``, ``vit_plugin.CIFAR10``, ``vit_plugin.CIFAR100``,
``vit_plugin.OxfordIIITPet``, ``vit_plugin.Flowers102`` and ``vit_plugin.CustomDataset``) behave
exactly like mmpretrain's, but first check the paths they are about to read and raise
:class:`DataRootNotFoundError` naming the missing path, the expected layout and where the README
explains how to prepare it. ``tools/train.py`` and ``tools/test.py`` print that message without a
traceback.

``vit_plugin.ImageNet21k`` reads a list file (``ann_file``) through the array-backed index of
:mod:`vit_plugin.datasets.compact_index` (seconds and little memory at 14.2M lines, shared by the
dataloader workers) instead of one Python dict per line; the records are the same.
"""
import os.path as osp
from typing import Callable, Dict, List, Union

from mmpretrain import datasets as mmpretrain_datasets

from vit_plugin.datasets.compact_index import CompactListMixin
from vit_plugin.registry import DATASETS

README_SECTION = "README.md, section 'Data preparation' (#data-preparation)"


class DataRootNotFoundError(FileNotFoundError):
    """A dataset's root, annotation file or image folder does not exist."""


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


#: class name -> (mmpretrain base class name, function listing the paths to check, layout hint).
_CHECKS: Dict[str, tuple] = {
    'ImageNet': ('ImageNet', _folder_or_list,
                 '<data_root>/{train,val}/... images and <data_root>/meta/{train,val}.txt, or class '
                 'sub-folders <data_root>/train/<wnid>/*.JPEG'),
    'ImageNet21k': ('ImageNet21k', _folder_or_list,
                    '<data_root>/meta/train.txt ("<relative path> <label>" per line) with images under '
                    '<data_root>/<data_prefix>, or class sub-folders <data_root>/train/<wnid>/*.JPEG'),
    'CustomDataset': ('CustomDataset', _folder_or_list,
                      'class sub-folders <data_root>/<data_prefix>/<class>/*.png, or a list file'),
    'CIFAR10': ('CIFAR10', _cifar, '<data_root>/cifar-10-batches-py/ (the python version)'),
    'CIFAR100': ('CIFAR100', _cifar, '<data_root>/cifar-100-python/ (the python version)'),
    'OxfordIIITPet': ('OxfordIIITPet', _pets,
                      '<data_root>/images/*.jpg and <data_root>/annotations/{trainval,test}.txt'),
    'Flowers102': ('Flowers102', _flowers, '<data_root>/jpg/*.jpg, <data_root>/imagelabels.mat, '
                   '<data_root>/setid.mat'),
}


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
                f'data as described in {README_SECTION}, or point the config at your copy, e.g. '
                f'`--cfg-options train_dataloader.dataset.data_root=/path/to/data '
                f'val_dataloader.dataset.data_root=/path/to/data`.')


#: class name -> classes put before mmpretrain's in the bases.
_MIXINS: Dict[str, tuple] = {'ImageNet21k': (CompactListMixin,)}


def _make_checked(name: str, base_name: str, list_paths: Callable, layout: str, mixins: tuple = ()):
    base = getattr(mmpretrain_datasets, base_name)

    def __init__(self, *args, **kwargs):
        if args:  # mmpretrain's classes take data_root (and split) first
            kwargs.update(zip(('data_root', 'split'), args))
        data_root = kwargs.get('data_root', '')
        split = kwargs.get('split', 'trainval' if name in ('OxfordIIITPet', 'Flowers102') else '')
        paths = ([data_root] if data_root else []) + list_paths(data_root, split, kwargs)
        check_dataset_paths(name, paths, layout)
        super(cls, self).__init__(**kwargs)

    doc = (f"mmpretrain's ``{base_name}``, checking first that its files exist "
           f'(:class:`DataRootNotFoundError` otherwise). Expected layout: {layout}. Arguments as for '
           f"mmpretrain's class.")
    if mixins:
        doc += (' A list file is served from an array-backed index cached as ``<ann_file>.index`` '
                '(``index_cache=False``: not cached); see :mod:`vit_plugin.datasets.compact_index`.')
    cls = type(name, (*mixins, base), {'__init__': __init__, '__doc__': doc, '__module__': __name__})
    return cls


for _name, (_base, _paths, _layout) in _CHECKS.items():
    globals()[_name] = DATASETS.register_module(
        name=_name, module=_make_checked(_name, _base, _paths, _layout, _MIXINS.get(_name, ())))

__all__ = ['DataRootNotFoundError', 'check_dataset_paths', 'README_SECTION', *_CHECKS]
