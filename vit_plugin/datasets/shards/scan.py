"""Sequential scans: :func:`open_for_scan` gives :mod:`tarfile` a seekable file over a shard, read
remotely in large blocks or through a reader's chunk cache (docs/data.md#remote-shards)."""
import io
from typing import Optional

from .errors import not_found, os_error, truncated
from .listing import fingerprint
from .locations import hf_local, is_hf, is_remote, local_path
from .reader import ShardReader
from .remote import RetryPolicy, fetch_range

DEFAULT_SCAN_BLOCK_BYTES = 16 << 20


def open_for_scan(url: str, block_bytes: int = DEFAULT_SCAN_BLOCK_BYTES, retry: Optional[RetryPolicy] = None,
                  keep_in: Optional[ShardReader] = None, version: Optional[dict] = None):
    """A seekable binary file over the shard at ``url``, for :mod:`tarfile` to read its headers in order.

    Local (and cached hf://) files are opened plainly. A remote file is read in ranges of at least
    ``block_bytes`` (about ``size / block_bytes`` requests), or with ``keep_in`` (a :class:`ShardReader`)
    through its chunk cache, where the chunks stay for the reads that follow; ``version`` is the shard's
    fingerprint (default: asked for).

    Raises:
        ShardReadError: the file does not exist or cannot be opened.
        RangesNotSupportedError: the server answers a range request with the whole file.
    """
    path = None
    if is_hf(url):
        path = hf_local(url)
    elif not is_remote(url):
        path = local_path(url)
    if path is not None:
        try:
            return open(path, 'rb')
        except FileNotFoundError:
            raise not_found(url) from None
        except OSError as err:
            raise os_error(url, err) from None
    if keep_in is not None:
        return _CachedScanFile(keep_in, url, version or fingerprint(url, keep_in.retry))
    return _RangeFile(url, int(fingerprint(url, retry)['size']), block_bytes, retry)


class _RangeFile(io.RawIOBase):
    """A read-only, seekable file over a remote file of ``size`` bytes, read in ranges of at least
    ``block_bytes``; the last range read is kept."""

    def __init__(self, url: str, size: int, block_bytes: int, retry: Optional[RetryPolicy]):
        super().__init__()
        self.url, self.size, self.block_bytes, self.retry = url, size, max(1, int(block_bytes)), retry
        self.name = url
        self._pos, self._start, self._data = 0, 0, b''

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, pos: int, whence: int = 0) -> int:
        self._pos = pos if whence == 0 else self._pos + pos if whence == 1 else self.size + pos
        return self._pos

    def read(self, n: int = -1) -> bytes:
        end = self.size if n is None or n < 0 else min(self.size, self._pos + n)
        if end <= self._pos:
            return b''
        if not (self._start <= self._pos and end <= self._start + len(self._data)):
            stop = min(self.size, max(end, self._pos + self.block_bytes))
            self._start, self._data = self._pos, fetch_range(self.url, self._pos, stop, self.retry)
            if len(self._data) != stop - self._pos:
                raise truncated(self.url, self._pos, stop - self._pos, self._pos + len(self._data))
        out = self._data[self._pos - self._start:end - self._start]
        self._pos += len(out)
        return out

    def readinto(self, buffer) -> int:
        data = self.read(len(buffer))
        buffer[:len(data)] = data
        return len(data)


class _CachedScanFile(_RangeFile):
    """A :class:`_RangeFile` whose ranges are the chunks of a reader (its cache keeps them)."""

    def __init__(self, reader: ShardReader, url: str, version: dict):
        super().__init__(url, int(version['size']), reader.chunk_bytes, reader.retry)
        self.reader, self.version = reader, version

    def read(self, n: int = -1) -> bytes:
        end = self.size if n is None or n < 0 else min(self.size, self._pos + n)
        out = []
        while self._pos < end:
            if not self._start <= self._pos < self._start + len(self._data):
                self._start = self._pos - self._pos % self.block_bytes
                self._data = self.reader.read(self.url, self._start, min(self.block_bytes, self.size - self._start),
                                              fingerprint=self.version)
            piece = self._data[self._pos - self._start:end - self._start]
            out.append(piece)
            self._pos += len(piece)
        return b''.join(out)
