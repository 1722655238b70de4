"""One file of named numpy arrays, memory-mapped read-only: the on-disk form of the dataset indexes.

The list-file index (:mod:`~vit_plugin.datasets.compact_index`) and the tar-shard index
(:mod:`~vit_plugin.datasets.tar_index`) keep their arrays here, so that the main process and every
data-loader worker share the same page-cache pages and a pickled index is a file name, not the arrays.

Layout::

    b'VPLSTIDX'  uint64 little-endian header length  header JSON (utf-8)  padding
    array data, each array at the byte offset the header gives (64-byte aligned)

The header holds the caller's fields (what the index was built from: a source file's size and time,
the shards' fingerprints ...) and ``arrays`` (dtype, shape and offset of each). A file is written under
a temporary name in the same folder and moved into place with ``os.replace``: readers see the old
file or the complete new one, never a half-written one. :func:`read_array_file` returns None for a
file that is missing, of another kind, built from other sources (``expect``) or shorter than its
header says (truncated), so the caller rebuilds it.
"""
import json
import os
import os.path as osp
import struct
import tempfile
from typing import Dict, Iterator, Optional, Tuple, Union

import numpy as np

MAGIC = b'VPLSTIDX'
_ALIGN = 64
_COPY_BYTES = 16 << 20


def _aligned(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


class SpooledArray:
    """A 1-D array built by appending chunks to a temporary file, so that building an index of millions
    of rows holds one chunk in memory at a time.

    Args:
        dtype: The element type.
        folder (str): Where the temporary file lives (the folder of the index being built, so that the
            final copy stays on one file system).
    """

    def __init__(self, dtype, folder: str):
        self.dtype = np.dtype(dtype)
        fd, self.path = tempfile.mkstemp(prefix='.spool.', suffix='.tmp', dir=folder)
        self._file = os.fdopen(fd, 'wb')
        self.size = 0

    def append(self, values: np.ndarray) -> None:
        values = np.ascontiguousarray(values, dtype=self.dtype).reshape(-1)
        self._file.write(values.data)
        self.size += len(values)

    @property
    def shape(self) -> Tuple[int]:
        return (self.size,)

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    def chunks(self, elements: int = _COPY_BYTES // 8) -> Iterator[np.ndarray]:
        """The appended values, ``elements`` at a time."""
        self._file.flush()
        data = np.memmap(self.path, dtype=self.dtype, mode='r', shape=(self.size,)) if self.size else ()
        for start in range(0, self.size, elements):
            yield np.asarray(data[start:start + elements])

    def close(self) -> None:
        """Delete the temporary file (also after an error)."""
        if not self._file.closed:
            self._file.close()
        if osp.exists(self.path):
            os.unlink(self.path)


ArraySource = Union[np.ndarray, SpooledArray]


def write_array_file(path: str, fields: dict, arrays: Dict[str, ArraySource]) -> None:
    """Write ``arrays`` and the header ``fields`` to ``path`` atomically (see the module docstring).

    Args:
        path (str): The file to (re)place.
        fields (dict): JSON-serialisable header fields; ``arrays`` is reserved.
        arrays (dict): Name to numpy array or :class:`SpooledArray`.

    Raises:
        OSError: The folder is not writable or the disk is full; nothing is left behind.
    """
    layout, offset = {}, 0
    for name, arr in arrays.items():
        layout[name] = {'dtype': arr.dtype.str, 'shape': list(arr.shape), 'offset': offset}
        offset += _aligned(arr.nbytes)
    header = json.dumps({**fields, 'arrays': layout}).encode()
    data_start = _aligned(len(MAGIC) + 8 + len(header))
    folder = osp.dirname(osp.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=osp.basename(path) + '.', suffix='.tmp', dir=folder)
    try:
        with os.fdopen(fd, 'wb') as f:
            f.write(MAGIC + struct.pack('<Q', len(header)) + header)
            for name, arr in arrays.items():
                f.seek(data_start + layout[name]['offset'])
                if isinstance(arr, SpooledArray):
                    for chunk in arr.chunks():
                        f.write(chunk.data)
                else:
                    f.write(np.ascontiguousarray(arr).data)
            f.truncate(data_start + offset)
        os.chmod(tmp, 0o644)  # mkstemp makes it owner-only; others reading the data may share it
        os.replace(tmp, path)
    except BaseException:
        if osp.exists(tmp):
            os.unlink(tmp)
        raise


def read_array_header(path: str) -> Optional[dict]:
    """The header of ``path`` (its fields and ``arrays``), or None when it is no array file."""
    try:
        with open(path, 'rb') as f:
            if f.read(len(MAGIC)) != MAGIC:
                return None
            (length,) = struct.unpack('<Q', f.read(8))
            header = json.loads(f.read(length))
            header['_data_start'] = _aligned(len(MAGIC) + 8 + length)
            header['_file_size'] = os.fstat(f.fileno()).st_size
    except (OSError, ValueError, struct.error):
        return None
    return header if isinstance(header, dict) else None


def read_array_file(path: str, expect: dict) -> Optional[Tuple[dict, Dict[str, np.ndarray]]]:
    """The header and the memory-mapped arrays of ``path``, or None when it is missing, another kind of
    file, truncated, or any field of ``expect`` differs from the header's.

    Args:
        path (str): The array file.
        expect (dict): Header fields that must match (e.g. the source's size and time).

    Returns:
        tuple[dict, dict] | None: ``(header, arrays)``.
    """
    header = read_array_header(path)
    if header is None or any(header.get(k) != v for k, v in expect.items()):
        return None
    arrays = {}
    for name, spec in header.get('arrays', {}).items():
        dtype, shape = np.dtype(spec['dtype']), tuple(spec['shape'])
        offset = header['_data_start'] + spec['offset']
        if offset + int(np.prod(shape)) * dtype.itemsize > header['_file_size']:
            return None  # truncated
        arrays[name] = (np.memmap(path, dtype=dtype, mode='r', offset=offset, shape=shape)
                        if np.prod(shape) else np.zeros(shape, dtype))
    return header, arrays


__all__ = ['MAGIC', 'SpooledArray', 'write_array_file', 'read_array_file', 'read_array_header']
