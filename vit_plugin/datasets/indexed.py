"""Dataset records served from an array index instead of one Python dict per sample.

mmengine's ``BaseDataset`` keeps a list of dicts (packed into one numpy buffer), which for millions of
samples costs minutes and gigabytes before the first batch. The indexes of this package (a list file:
:mod:`~vit_plugin.datasets.compact_index`; tar shards: :mod:`~vit_plugin.datasets.tar_index`) hold
the same information in memory-mapped arrays; :class:`IndexedRecordsMixin` serves a dataset's records
from such an index, keeping mmengine's meaning of ``indices``, ``get_subset``/``get_subset_``,
``lazy_init``, ``get_cat_ids`` and ``get_gt_labels``.
"""
from typing import Optional, Sequence, Union

import numpy as np
from mmengine.dataset.base_dataset import force_full_init


class IndexedRecordsMixin:
    """Serve an mmengine dataset's records from an index with a ``labels`` array (one per row).

    Put it before the mmengine/mmpretrain dataset class in the bases. A subclass implements:

    * ``_uses_index()``: whether this instance reads an index (False: the base class does everything,
      e.g. mmpretrain's folder layout);
    * ``_open_index()``: build or open the index (any object with ``__len__`` and a ``labels`` array);
    * ``_record(row)``: the record of index row ``row`` (``sample_idx`` is added here).
    """

    def __init__(self, *args, **kwargs):
        self._index = None
        self._selection: Optional[np.ndarray] = None  # index rows after ``indices``
        super().__init__(*args, **kwargs)

    def _uses_index(self) -> bool:
        return True

    def _open_index(self):
        raise TypeError(f'{type(self).__name__} must define _open_index()')

    def _record(self, row: int) -> dict:
        raise TypeError(f'{type(self).__name__} must define _record(row)')

    def full_init(self):
        if not self._uses_index():
            return super().full_init()
        if self._fully_initialized:
            return
        self._index = self._open_index()
        self._selection = None
        if self._indices is not None:
            self._selection = self._positions(self._indices)
        self._fully_initialized = True

    def _rows(self) -> np.ndarray:
        return self._selection if self._selection is not None else np.arange(len(self._index))

    def _positions(self, indices: Union[int, Sequence[int]]) -> np.ndarray:
        """Index rows kept by mmengine's ``indices`` semantics (int: first/last n; sequence: these)."""
        rows = self._rows()
        if isinstance(indices, (int, np.integer)):
            return rows[:indices] if indices >= 0 else rows[indices:]
        if isinstance(indices, (Sequence, np.ndarray)):
            pos = np.asarray(indices, dtype=np.int64).reshape(-1)
            n = len(rows)
            bad = pos[(pos >= n) | (pos < -n)]
            if len(bad):
                raise IndexError(f'index {int(bad[0])} is out of range for a dataset of {n} samples')
            return rows[pos]
        raise TypeError(f'indices should be an int or a sequence of int, but got {type(indices)}')

    def row_of(self, idx: int) -> int:
        """The index row of sample ``idx`` (negative ``idx`` counts from the end)."""
        n = len(self)
        if not -n <= idx < n:
            raise IndexError(f'index {idx} is out of range for a dataset of {n} samples')
        idx = int(idx) % n
        return int(self._selection[idx]) if self._selection is not None else idx

    @force_full_init
    def __len__(self) -> int:
        if not self._uses_index():
            return super().__len__()
        return len(self._selection) if self._selection is not None else len(self._index)

    @force_full_init
    def get_data_info(self, idx: int) -> dict:
        if not self._uses_index():
            return super().get_data_info(idx)
        record = self._record(self.row_of(idx))
        record['sample_idx'] = int(idx) % len(self)
        return record

    @force_full_init
    def get_cat_ids(self, idx: int):
        if not self._uses_index():
            return super().get_cat_ids(idx)
        return [int(self._index.labels[self.row_of(idx)])]

    @force_full_init
    def get_gt_labels(self) -> np.ndarray:
        if not self._uses_index():
            return super().get_gt_labels()
        labels = self._index.labels
        return np.asarray(labels if self._selection is None else labels[self._selection], dtype=np.int64)

    @force_full_init
    def get_subset_(self, indices: Union[int, Sequence[int]]) -> None:
        if not self._uses_index():
            return super().get_subset_(indices)
        self._selection = self._positions(indices)

    @force_full_init
    def get_subset(self, indices: Union[int, Sequence[int]]):
        if not self._uses_index():
            return super().get_subset(indices)
        # mmengine's default ``memo`` is one dict shared by all calls: pass a fresh one. The copy
        # shares the (read-only) index and deep-copies the rest.
        sub = self._copy_without_annotation({})
        sub._selection = self._positions(indices)
        return sub


__all__ = ['IndexedRecordsMixin']
