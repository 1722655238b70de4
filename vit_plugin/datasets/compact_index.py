"""The array-backed index of a ``"<relative path> <label>"`` list file, and the dataset mixin that reads it.

The index is three arrays (``paths`` bytes, ``offsets``, ``labels``) cached as ``<ann_file>.index`` (an
:mod:`~vit_plugin.datasets.array_file`) and memory-mapped; docs/configs.md (ImageNet-21k) tells why and
docs/benchmarks.md#dataset-index what it saves.
"""
import codecs
import os
import os.path as osp
import warnings
from typing import Optional, Tuple

import numpy as np

from vit_plugin.datasets.array_file import read_array_file, write_array_file
from vit_plugin.datasets.indexed import IndexedRecordsMixin, check_label_range

FORMAT_VERSION = 1
CACHE_SUFFIX = '.index'
_MAX_LABEL_DIGITS = 9  # any 9-digit number fits int32

# What Python's ``str.strip()`` removes, restricted to ASCII (mmpretrain strips each line before it
# splits path and label): \t \n \v \f \r, the separators \x1c-\x1f, and the space.
_WHITESPACE = np.zeros(256, dtype=bool)
_WHITESPACE[[9, 10, 11, 12, 13, 28, 29, 30, 31, 32]] = True


class ListFileError(ValueError):
    """A list file is empty, or a line is not ``"<path> <label>"`` with a label in ``[0, num_classes)``."""


def _line_error(filename: str, line_no: int, line: bytes, reason: str) -> ListFileError:
    text = line.decode('utf-8', errors='replace')
    if len(text) > 200:
        text = text[:200] + '...'
    return ListFileError(
        f"{filename}, line {line_no}: {reason}; expected '<relative path> <label>' (the label is the "
        f'non-negative integer after the last space), got {text!r}.')


def _parse_chunk(buf: np.ndarray, filename: str, first_line_no: int
                 ) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Parse whole lines in ``buf`` (uint8); returns path bytes, path lengths and labels."""
    size = len(buf)
    ends = np.flatnonzero(buf == 10)
    if size and buf[-1] != 10:  # a last line without a newline
        ends = np.append(ends, size)
    starts = np.empty_like(ends)
    if len(ends):
        starts[0] = 0
        starts[1:] = ends[:-1] + 1

    def fail(i: int, reason: str):
        raise _line_error(filename, first_line_no + int(i), buf[starts[i]:ends[i]].tobytes(), reason)

    # mmengine reads list files as UTF-8: fail here, naming the line, rather than later in a worker.
    if size and buf.max() >= 128:  # ASCII (the usual case) is valid UTF-8
        try:
            codecs.utf_8_decode(memoryview(buf), 'strict', True)
        except UnicodeDecodeError as err:
            fail(np.searchsorted(ends, err.start), f'not valid UTF-8 ({err.reason})')

    # Strip leading and trailing whitespace like ``str.strip()``; a few passes at most in practice.
    last = max(size - 1, 0)
    s, e = starts.copy(), ends.copy()
    while True:
        move = (s < e) & _WHITESPACE[buf[np.minimum(s, last)]]
        if not move.any():
            break
        s += move
    while True:
        move = (s < e) & _WHITESPACE[buf[np.maximum(e - 1, 0)]]
        if not move.any():
            break
        e -= move
    # Every check runs on all lines, and the first bad line in the file is reported.
    problems = []

    def first(mask: np.ndarray, reason: str):
        hit = np.flatnonzero(mask)
        if len(hit):
            problems.append((int(hit[0]), reason))

    empty = s >= e
    first(empty, 'empty line')
    # The label is what follows the last space of the stripped line (``rsplit(' ', 1)``).
    spaces = np.flatnonzero(buf == 32)
    k = np.searchsorted(spaces, e, side='left') - 1
    sep = spaces[np.maximum(k, 0)] if len(spaces) else np.full_like(e, -1)
    no_space = ~empty & ((k < 0) | (sep < s))
    first(no_space, 'no space between path and label')
    label_len = np.where(empty | no_space, 0, e - sep - 1)
    first(label_len > _MAX_LABEL_DIGITS, f'the label has more than {_MAX_LABEL_DIGITS} digits')
    labels = np.zeros(len(e), dtype=np.int64)
    not_digit = np.zeros(len(e), dtype=bool)
    scale = 1
    for digit_pos in range(min(int(label_len.max(initial=0)), _MAX_LABEL_DIGITS)):
        has = np.flatnonzero(label_len > digit_pos)
        digit = buf[e[has] - 1 - digit_pos].astype(np.int64) - 48
        not_digit[has[(digit < 0) | (digit > 9)]] = True
        labels[has] += digit * scale
        scale *= 10
    first(not_digit, 'the label is not a non-negative integer')
    if problems:
        fail(*min(problems))

    # Keep the bytes [s, sep) of every line: +1 where a path starts, -1 where it ends, cumulative sum.
    mark = np.zeros(size + 1, dtype=np.int8)
    mark[s] = 1
    mark[sep] = -1
    keep = np.cumsum(mark[:size], dtype=np.int8).view(bool)
    return buf[keep], sep - s, labels.astype(np.int32)


def parse_list_file(filename: str, chunk_bytes: int = 16 << 20
                    ) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Parse a list file as mmpretrain's ``CustomDataset`` does: each line stripped (ASCII whitespace) and
    split at its last space; lines end at ``\\n``. ``chunk_bytes`` (whole lines) bounds the temporary memory.

    Returns:
        tuple: ``paths`` (uint8), ``offsets`` (int64, lines + 1) and ``labels`` (int32).

    Raises:
        ListFileError: The file is empty, or a line is empty, has no space, a label that is not a
            non-negative integer, or is not UTF-8 (file and line named).
    """
    size = osp.getsize(filename)
    if size == 0:
        raise empty_list_error(filename)
    data = np.memmap(filename, dtype=np.uint8, mode='r')
    # Count the lines first so that the outputs are filled in place: no list of chunks to concatenate
    # (which would hold the paths twice). ``paths`` gets an upper bound; pages never written are never
    # allocated, and the result is a view of its used part.
    num_lines = sum(int(np.count_nonzero(data[i:i + chunk_bytes] == 10)) for i in range(0, size, chunk_bytes))
    num_lines += int(size > 0 and data[-1] != 10)
    paths = np.empty(size, dtype=np.uint8)
    offsets = np.zeros(num_lines + 1, dtype=np.int64)
    labels = np.empty(num_lines, dtype=np.int32)
    start, line, used = 0, 0, 0
    while start < size:
        end = min(start + chunk_bytes, size)
        while end < size:  # cut after the chunk's last newline (grow the chunk for a huge line)
            newlines = np.flatnonzero(data[start:end] == 10)
            if len(newlines):
                end = start + int(newlines[-1]) + 1
                break
            end = min(end + chunk_bytes, size)
        chunk_paths, chunk_lengths, chunk_labels = _parse_chunk(np.asarray(data[start:end]), filename, line + 1)
        count = len(chunk_labels)
        paths[used:used + len(chunk_paths)] = chunk_paths
        np.cumsum(chunk_lengths, out=offsets[line + 1:line + 1 + count])
        offsets[line + 1:line + 1 + count] += used
        labels[line:line + count] = chunk_labels
        used += len(chunk_paths)
        line += count
        start = end
    del data
    return paths[:used], offsets, labels


def empty_list_error(filename: str) -> ListFileError:
    return ListFileError(f'{filename}: the list file is empty, so the dataset has no samples; expected one '
                         f"'<relative path> <label>' line per image (README.md, section 'Data preparation').")


def check_labels(labels: np.ndarray, num_classes: int, filename: str) -> None:
    """Raise :class:`ListFileError` naming the first line of ``filename`` whose label is outside
    ``[0, num_classes)`` (:func:`~vit_plugin.datasets.indexed.check_label_range`)."""
    check_label_range(labels, num_classes, lambda row: f'{filename}, line {row + 1}', ListFileError)


def _source_key(filename: str) -> dict:
    st = os.stat(filename)
    return {'version': FORMAT_VERSION, 'size': st.st_size, 'mtime_ns': st.st_mtime_ns}


def _read_cache(cache_path: str, key: dict) -> Optional[dict]:
    """The memory-mapped arrays of ``cache_path`` if it exists and matches ``key``, else None."""
    found = read_array_file(cache_path, key)
    return None if found is None else found[1]


class ListFileIndex:
    """The paths (uint8 ``paths`` cut at int64 ``offsets``) and int32 ``labels`` of a list file (use :meth:`open`).

    Read-only: copies share it; pickling sends the cache file's name (checked again on load), or the arrays.
    """

    def __init__(self, paths: np.ndarray, offsets: np.ndarray, labels: np.ndarray,
                 cache_path: Optional[str] = None, key: Optional[dict] = None):
        self.paths, self.offsets, self.labels = paths, offsets, labels
        self.cache_path, self.key = cache_path, key

    @classmethod
    def open(cls, filename: str, cache: bool = True, num_classes: Optional[int] = None) -> 'ListFileIndex':
        """Index ``filename``, reusing or (re)writing ``<filename>.index`` when ``cache`` is True.

        Args:
            filename (str): The list file.
            cache (bool): Use the cache; an unwritable folder gives a warning and an in-memory index.
            num_classes (int, optional): Check every label against ``[0, num_classes)`` on every open.

        Raises:
            ListFileError: The list is empty or malformed, or a label is out of range (file and line named).
        """
        index = cls._open(filename, cache)
        if not len(index):
            raise empty_list_error(filename)
        if num_classes is not None:
            check_labels(index.labels, num_classes, filename)
        return index

    @classmethod
    def _open(cls, filename: str, cache: bool) -> 'ListFileIndex':
        key = _source_key(filename)
        cache_path = osp.abspath(filename) + CACHE_SUFFIX  # pickled: valid from any working dir
        if cache:
            arrays = _read_cache(cache_path, key)
            if arrays is not None:
                return cls(**arrays, cache_path=cache_path, key=key)
        paths, offsets, labels = parse_list_file(filename)
        if _source_key(filename) != key:
            raise RuntimeError(f'{filename} changed while it was being indexed; try again.')
        if not cache:
            return cls(paths, offsets, labels)
        try:
            write_array_file(cache_path, key, {'paths': paths, 'offsets': offsets, 'labels': labels})
        except OSError as err:
            warnings.warn(f'Could not write the list-file index {cache_path!r} ({err}); indexing '
                          f'{filename!r} in memory, which every run repeats and which spawned dataloader '
                          f'workers receive as a copy. Make the folder writable to cache it.')
            return cls(paths, offsets, labels)
        arrays = _read_cache(cache_path, key)
        if arrays is None:  # replaced by a newer list file meanwhile: keep what was parsed
            return cls(paths, offsets, labels)
        return cls(**arrays, cache_path=cache_path, key=key)

    def __len__(self) -> int:
        return len(self.labels)

    def path(self, i: int) -> str:
        """The relative path of line ``i`` (0-based)."""
        return self.paths[self.offsets[i]:self.offsets[i + 1]].tobytes().decode('utf-8')

    def label(self, i: int) -> int:
        """The label of line ``i`` (0-based)."""
        return int(self.labels[i])

    def __getstate__(self) -> dict:
        if self.cache_path is not None:  # a name, not the (mapped) arrays
            return {'cache_path': self.cache_path, 'key': self.key}
        return {'paths': self.paths, 'offsets': self.offsets, 'labels': self.labels}

    def __setstate__(self, state: dict) -> None:
        if 'cache_path' in state:
            arrays = _read_cache(state['cache_path'], state['key'])
            if arrays is None:
                raise RuntimeError(
                    f"The list-file index {state['cache_path']!r} changed or vanished after the dataset "
                    f'was built (was the list file edited during the run?); restart the run.')
            self.__init__(**arrays, cache_path=state['cache_path'], key=state['key'])
        else:
            self.__init__(**state)

    def __deepcopy__(self, memo) -> 'ListFileIndex':
        return self  # read-only: sharing is a copy


class CompactListMixin(IndexedRecordsMixin):
    """Serve a mmpretrain ``CustomDataset``-style list file (``ann_file``) from a :class:`ListFileIndex`.

    Put it before mmpretrain's class in the bases; without ``ann_file`` (folder layout) the base class
    serves the records. Labels are checked against the ``num_classes`` attribute; ``with_label=False`` is
    refused. ``index_cache`` (default True): keep the index as ``<ann_file>.index``.
    """
    num_classes: Optional[int] = None

    def __init__(self, *args, index_cache: bool = True, **kwargs):
        self.index_cache = index_cache
        super().__init__(*args, **kwargs)

    def _reads_index(self) -> bool:
        return bool(self.ann_file)

    def _open_index(self) -> ListFileIndex:
        if not getattr(self, 'with_label', True):
            raise ValueError(f'{type(self).__name__}: with_label=False is not supported for list files; '
                             f"use mmpretrain's CustomDataset for a list of paths without labels.")
        index = ListFileIndex.open(self.ann_file, cache=self.index_cache, num_classes=self.num_classes)
        # As mmpretrain's BaseDataset.full_init: OpenMMLab 2.0 'categories' give 'classes'.
        if 'categories' in self._metainfo and 'classes' not in self._metainfo:
            categories = sorted(self._metainfo['categories'], key=lambda x: x['id'])
            self._metainfo['classes'] = tuple(cat['category_name'] for cat in categories)
        return index

    def _record(self, row: int) -> dict:
        # mmpretrain joins with the file backend's join_path, which is os.path.join for local files.
        return {'img_path': osp.join(self.img_prefix, self._index.path(row)), 'gt_label': self._index.label(row)}
