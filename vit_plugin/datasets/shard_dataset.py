"""``vit_plugin.TarShardDataset``: images read from tar shards, local or remote, without extracting.

Records are mmpretrain's (``img_path`` ``<shard>:<member>``, ``gt_label``, ``sample_idx``, ``key``), served
from the shards' index (:mod:`~vit_plugin.datasets.tar_index`, :mod:`~vit_plugin.datasets.indexed`);
loading adds ``img_bytes``, which vit_plugin's loaders decode as a file. docs/data.md tells the story.
"""
from typing import Optional, Sequence, Union

import numpy as np
from mmcv.transforms import LoadImageFromFile as MMCVLoadImageFromFile
from mmengine.dataset.base_dataset import force_full_init
from mmpretrain.datasets import BaseDataset

from vit_plugin import label_spaces
from vit_plugin.datasets.decode import ImageDecodeError
from vit_plugin.datasets.indexed import IndexedRecordsMixin, check_label_range
from vit_plugin.datasets.shards import ShardReader, ShardReadError
from vit_plugin.datasets.tar_index import LabelRule, TarIndexError, TarShardIndex, resolve_shards
from vit_plugin.datasets.transforms import LoadAndInceptionCrop, LoadImageFromFile
from vit_plugin.registry import DATASETS


class SampleReadError(ShardReadError):
    """A sample's bytes could not be read from its shard (mid-run); names the shard and the member."""

    def __init__(self, location: str, reason: str = ''):
        super().__init__(location, reason)
        self.path = location


@DATASETS.register_module()
class TarShardDataset(IndexedRecordsMixin, BaseDataset):
    """Images and labels from tar shards (WebDataset layout) or a tar of per-synset tars (docs/data.md).

    Args:
        data_root (str): The shards' folder: a local path or an fsspec URL (``s3://``, ``hf://datasets/...``).
        shards (str | list[str], optional): A brace pattern or names; None: the split's shards from the
            split file (``_info.json``), else the folder's ``.tar`` files named ``*-<split>-*``.
        split (str, optional): The split's name. Defaults to 'train'.
        layout (str): ``'webdataset'`` or ``'tar_of_tars'``. Defaults to 'webdataset'.
        label (dict, optional): ``dict(source='cls' | 'json' | 'synset', key=<json field>)``.
        label_space (str, optional): The class order of the labels (:mod:`vit_plugin.label_spaces`).
        target_label_space (str, optional): Give labels in this order instead (e.g. ``'google21k'``).
        num_classes (int, optional): Every label must lie in ``[0, num_classes)``.
        index_file (str, optional): The index file; default beside local writable shards, else the cache.
        index_workers (int, optional): Processes that build the index; default every core.
        index_wait_s (float, optional): The longest wait for another process's index build; None: none.
        duplicate_keys (str): Rows sharing a sample key: ``'warn'`` or ``'error'``. Defaults to 'warn'.
        reader (dict, optional): :class:`~vit_plugin.datasets.shards.ShardReader`'s arguments.
        pipeline, test_mode, indices, lazy_init, metainfo, max_refetch: As mmengine's ``BaseDataset``.
    """

    def __init__(self, data_root: str, shards: Union[None, str, Sequence[str]] = None,
                 split: Optional[str] = 'train', layout: str = 'webdataset', label: Optional[dict] = None,
                 label_space: Optional[str] = None, target_label_space: Optional[str] = None,
                 num_classes: Optional[int] = None, index_file: Optional[str] = None,
                 index_workers: Optional[int] = None, reader: Optional[dict] = None, pipeline=(),
                 test_mode: bool = False, indices=None, lazy_init: bool = False,
                 metainfo: Optional[dict] = None, max_refetch: int = 1000,
                 index_wait_s: Optional[float] = 86400.0, duplicate_keys: str = 'warn'):
        label = dict(label or {})
        source = label.pop('source', 'synset' if layout == 'tar_of_tars' else 'cls')
        json_key = label.pop('key', 'label')
        if label:
            raise ValueError(f'TarShardDataset: unknown label option(s) {sorted(label)}; use source= and key=')
        if num_classes is not None and (not isinstance(num_classes, int) or isinstance(num_classes, bool)
                                        or num_classes < 1):
            raise ValueError(f'TarShardDataset: num_classes must be a positive int, got {num_classes!r}')
        self.shards, self.split, self.layout = shards, split, layout
        self.label_space = label_space and label_spaces.canonical_name(label_space)
        self.target_label_space = target_label_space and label_spaces.canonical_name(target_label_space)
        self.rule = LabelRule(source, json_key, _listed_synsets(self.label_space) if source == 'synset' else None)
        self.num_classes = num_classes
        self.index_file, self.index_workers = index_file, index_workers
        self.index_wait_s, self.duplicate_keys = index_wait_s, duplicate_keys
        self.reader = ShardReader(**(reader or {}))
        self._labels = None  # the labels after target_label_space
        # No prefix: mmengine would join it to data_root with a file backend, which knows no hf:// or s3://.
        super().__init__(ann_file='', metainfo=metainfo, data_root=str(data_root), data_prefix={},
                         pipeline=pipeline, test_mode=test_mode, indices=indices, lazy_init=lazy_init,
                         max_refetch=max_refetch)
        _check_loader(self.pipeline)

    @property
    def shard_root(self) -> str:
        """Alias of ``data_root``."""
        return self.data_root

    @property
    def img_prefix(self) -> str:
        return ''  # the records' img_path is whole

    def _open_index(self) -> TarShardIndex:
        retry = self.reader.retry
        shard_list = resolve_shards(self.data_root, self.shards, self.split, retry=retry)
        open_args = dict(layout=self.layout, rule=self.rule, index_path=self.index_file, split=self.split,
                         workers=self.index_workers, retry=retry, keep_in=self.reader, wait_s=self.index_wait_s,
                         duplicate_keys=self.duplicate_keys)
        index = TarShardIndex.open(shard_list, **open_args)
        if self.label_space and self.rule.source == 'synset' and self.rule.synsets is None:
            # winter21: the space is the sorted synsets of the data (checked to be 19,167 of them)
            label_spaces.label_space_from_synsets(index.synsets, self.label_space)
        labels = index.labels
        if self.target_label_space:
            source_space = self.label_space
            if source_space is None:
                raise TarIndexError('target_label_space needs label_space: the order the shards\' labels are in')
            mapped = label_spaces.index_map(source_space, self.target_label_space)[np.asarray(labels)]
            if (mapped < 0).any():
                row = int(np.argmax(mapped < 0))
                raise TarIndexError(f'{index.location(row)}: class {int(labels[row])} of {source_space} has no '
                                    f'counterpart in {self.target_label_space}; choose another target_label_space')
            labels = mapped.astype(np.int32)
        self._labels = labels
        if self.num_classes is not None:
            check_label_range(labels, self.num_classes, index.location, TarIndexError)
        classes = self._class_names(index)
        if classes is not None and 'classes' not in self._metainfo:
            self._metainfo['classes'] = classes
        return index

    def _class_names(self, index: TarShardIndex):
        space = self.target_label_space or self.label_space
        if space and _listed_synsets(space) is not None:
            return label_spaces.class_names(space)
        return index.synsets  # the data's own synsets (source='synset' without a label space), else None

    def index_labels(self) -> np.ndarray:
        return self._labels

    def _record(self, row: int) -> dict:
        index = self._index
        return {'img_path': index.location(row), 'gt_label': int(self._labels[row]), 'key': index.key(row)}

    @force_full_init
    def data_fingerprint(self) -> dict:
        """The sample count and, per shard, ``[name, bytes, samples]`` (``vit_plugin.DataIdentityHook``)."""
        index = self._index
        counts = np.diff(index.shard_starts).tolist()  # shard_starts ends with the row count
        return {'samples': len(self), 'shards': [[name, int(found['size']), int(count)] for name, found, count
                                                 in zip(index.shard_names, index.fingerprints, counts)]}

    def prepare_data(self, idx: int):
        """The record of sample ``idx`` with its image's bytes (``img_bytes``), through the pipeline."""
        record = self.get_data_info(idx)
        row = self.row_of(idx)
        index = self._index
        shard = index.shard_of(row)
        try:
            record['img_bytes'] = self.reader.read(index.shard_url(shard), int(index.offsets[row]),
                                                   int(index.sizes[row]), fingerprint=index.fingerprints[shard])
        except ShardReadError as err:
            raise SampleReadError(record['img_path'], err.reason or str(err)) from None
        try:
            return self.pipeline(record)
        except ImageDecodeError as err:  # the advice for a sample of a shard, not for a file
            raise err.for_source('shard' if self.layout == 'webdataset' else 'tar_of_tars') from None

    @property
    @force_full_init
    def index_path(self) -> str:
        """The index file this dataset reads (built, or waited for, when it opened)."""
        return self._index.path

    def extra_repr(self):
        return [f'Shards: {self.data_root} ({self.layout})', f'Labels: {self.rule.source}'
                + (f' in {self.label_space}' if self.label_space else '')]


def _listed_synsets(space: Optional[str]):
    """The synsets of a label space with a list; None without a space, or for one the data defines (winter21)."""
    if not space:
        return None
    try:
        return label_spaces.synsets(space)
    except label_spaces.LabelSpaceError:
        if space in label_spaces.BUILTIN_SPACES and label_spaces.BUILTIN_SPACES[space].file is None:
            return None
        raise


def _check_loader(pipeline) -> None:
    """Refuse mmcv's file loaders, which would look for a file named ``<shard>:<member>``."""
    for transform in getattr(pipeline, 'transforms', []):
        if isinstance(transform, (LoadAndInceptionCrop, LoadImageFromFile)):
            return
        if isinstance(transform, MMCVLoadImageFromFile):
            raise ValueError(f'TarShardDataset: the pipeline loads images with {type(transform).__name__}, which '
                             f"reads files; use dict(type='vit_plugin.LoadImageFromFile') or "
                             f"dict(type='vit_plugin.LoadAndInceptionCrop', ...), which read the shards' bytes")


__all__ = ['TarShardDataset', 'SampleReadError']
