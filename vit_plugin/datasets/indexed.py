"""An mmengine dataset's records served from an index of arrays (docs/data.md#the-index).

:class:`IndexedRecordsMixin` keeps mmengine's meaning of ``indices``, ``get_subset``/``get_subset_``,
``lazy_init``, ``get_cat_ids`` and ``get_gt_labels``; :func:`check_label_range` is the label check of
every index.
"""
import abc
from typing import Callable, Optional, Sequence, Type, Union

import numpy as np
from mmengine.dataset.base_dataset import force_full_init


def check_label_range(labels: np.ndarray, num_classes: int, where: Callable[[int], str],
                      error: Type[Exception] = ValueError) -> None:
    """Raise ``error`` unless every label lies in ``[0, num_classes)`` (a positive int, else ValueError).

    ``where(row)`` names a row in the message: ``'<file>, line 5'``, ``'<shard>:<member>'``.
    """
    if not isinstance(num_classes, (int, np.integer)) or isinstance(num_classes, bool) or num_classes < 1:
        raise ValueError(f'num_classes must be a positive int, got {num_classes!r}')
    if not len(labels):
        return
    low, top = int(labels.min()), int(labels.max())  # no allocation on the passing path
    if low >= 0 and top < num_classes:
        return
    bad = (labels < 0) | (labels >= num_classes)
    row = int(np.argmax(bad))
    raise error(f'{where(row)}: label {int(labels[row])} is outside [0, {num_classes}) '
                f'({int(np.count_nonzero(bad)):,} of {len(labels):,} labels are outside, the largest label is '
                f'{top}). Set num_classes (dataset, data preprocessor and head) to the classes of the data, '
                f'or correct the labels.')


class IndexedRecordsMixin(abc.ABC):
    """Serve a dataset's records from an index (``len()`` rows, a ``labels`` array); put it first in the bases.

    ``full_init`` picks the :class:`RecordSource`: :class:`FromDataList` where ``_reads_index()`` is False.
    """

    def __init__(self, *args, **kwargs):
        self._index = None
        self._selection: Optional[np.ndarray] = None  # index rows after ``indices``
        self._records: Optional[RecordSource] = None
        super().__init__(*args, **kwargs)

    def _reads_index(self) -> bool:
        return True  # False: the base class's ``data_list`` serves the records

    @abc.abstractmethod
    def _open_index(self):
        """Build or open the index."""

    @abc.abstractmethod
    def _record(self, row: int) -> dict:
        """The record of index row ``row``, without ``sample_idx``."""

    def index_labels(self) -> np.ndarray:
        """The label of every index row."""
        return self._index.labels

    def full_init(self):
        if self._fully_initialized:
            return
        if not self._reads_index():
            self._records = FROM_DATA_LIST
            return super().full_init()
        self._records = FROM_INDEX
        self._index = self._open_index()
        self._selection = None if self._indices is None else self._positions(self._indices)
        self._fully_initialized = True

    def index_rows(self) -> np.ndarray:
        """The index rows of the samples, in order."""
        return self._selection if self._selection is not None else np.arange(len(self._index))

    def _positions(self, indices: Union[int, Sequence[int]]) -> np.ndarray:
        """Index rows kept by mmengine's ``indices`` semantics (int: first/last n; sequence: these)."""
        rows = self.index_rows()
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
        return self._records.length(self)

    @force_full_init
    def get_data_info(self, idx: int) -> dict:
        return self._records.data_info(self, idx)

    @force_full_init
    def get_cat_ids(self, idx: int):
        return self._records.cat_ids(self, idx)

    @force_full_init
    def get_gt_labels(self) -> np.ndarray:
        return self._records.gt_labels(self)

    @force_full_init
    def get_subset_(self, indices: Union[int, Sequence[int]]) -> None:
        return self._records.subset_(self, indices)

    @force_full_init
    def get_subset(self, indices: Union[int, Sequence[int]]):
        return self._records.subset(self, indices)

    def _select(self, indices: Union[int, Sequence[int]]) -> None:
        self._selection = self._positions(indices)

    def _copy_selecting(self, indices: Union[int, Sequence[int]]):
        # mmengine's default ``memo`` is one dict shared by all calls: pass a fresh one. The copy
        # shares the (read-only) index and deep-copies the rest.
        sub = self._copy_without_annotation({})
        sub._selection = self._positions(indices)
        return sub


class RecordSource(abc.ABC):
    """Where an :class:`IndexedRecordsMixin` dataset's records come from: each method does what the dataset's
    method of that name (``__len__``, ``get_data_info``, ``get_cat_ids``, ``get_gt_labels``, ``get_subset_``,
    ``get_subset``) does in mmengine. Stateless: one instance each."""

    @abc.abstractmethod
    def length(self, dataset) -> int: ...

    @abc.abstractmethod
    def data_info(self, dataset, idx: int) -> dict: ...

    @abc.abstractmethod
    def cat_ids(self, dataset, idx: int) -> list: ...

    @abc.abstractmethod
    def gt_labels(self, dataset) -> np.ndarray: ...

    @abc.abstractmethod
    def subset_(self, dataset, indices) -> None: ...

    @abc.abstractmethod
    def subset(self, dataset, indices): ...

    def __deepcopy__(self, memo):
        return self


class FromIndex(RecordSource):
    """Records of the dataset's index rows (after ``indices`` and subsets)."""

    def length(self, dataset) -> int:
        return len(dataset.index_rows())

    def data_info(self, dataset, idx: int) -> dict:
        record = dataset._record(dataset.row_of(idx))
        record['sample_idx'] = int(idx) % len(dataset)
        return record

    def cat_ids(self, dataset, idx: int) -> list:
        return [int(dataset.index_labels()[dataset.row_of(idx)])]

    def gt_labels(self, dataset) -> np.ndarray:
        return np.asarray(dataset.index_labels()[dataset.index_rows()], dtype=np.int64)

    def subset_(self, dataset, indices) -> None:
        dataset._select(indices)

    def subset(self, dataset, indices):
        return dataset._copy_selecting(indices)


class FromDataList(RecordSource):
    """mmengine's ``data_list``: every call goes to the class after :class:`IndexedRecordsMixin`."""

    def length(self, dataset) -> int:
        return super(IndexedRecordsMixin, dataset).__len__()

    def data_info(self, dataset, idx: int) -> dict:
        return super(IndexedRecordsMixin, dataset).get_data_info(idx)

    def cat_ids(self, dataset, idx: int) -> list:
        return super(IndexedRecordsMixin, dataset).get_cat_ids(idx)

    def gt_labels(self, dataset) -> np.ndarray:
        return super(IndexedRecordsMixin, dataset).get_gt_labels()

    def subset_(self, dataset, indices) -> None:
        super(IndexedRecordsMixin, dataset).get_subset_(indices)

    def subset(self, dataset, indices):
        return super(IndexedRecordsMixin, dataset).get_subset(indices)


FROM_INDEX, FROM_DATA_LIST = FromIndex(), FromDataList()

__all__ = ['IndexedRecordsMixin', 'RecordSource', 'FromIndex', 'FromDataList', 'check_label_range']
