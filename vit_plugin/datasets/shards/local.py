"""Local reads: ``os.pread`` on a small LRU of open descriptors, one per process and reader, thread-safe
(docs/data.md#remote-shards). The chunk cache's files are read through it too."""
import os
import threading
from collections import OrderedDict
from typing import NamedTuple, Optional

from .errors import not_found, os_error, truncated


class OpenFile(NamedTuple):
    fd: int
    size: int


class OpenFiles:
    """At most ``limit`` open read-only descriptors, the least recently used closed first.

    Its lock guards each ``pread`` too, so that no thread closes a descriptor while another reads it.
    """

    def __init__(self, limit: int):
        self.limit = limit
        self.lock = threading.Lock()
        self.files: 'OrderedDict[str, OpenFile]' = OrderedDict()

    def __contains__(self, path: str) -> bool:
        return path in self.files

    def get(self, path: str) -> Optional[OpenFile]:
        """The open descriptor of ``path``, None when it is not open."""
        with self.lock:
            found = self.files.get(path)
            if found is not None:
                self.files.move_to_end(path)
            return found

    def open(self, path: str) -> OpenFile:
        """The open descriptor of ``path``, opened (and the oldest closed) when not open; ``OSError``."""
        found = self.get(path)
        if found is not None:
            return found
        fd = os.open(path, os.O_RDONLY)
        opened = OpenFile(fd, os.fstat(fd).st_size)
        with self.lock:
            if path in self.files:  # another thread opened it meanwhile
                os.close(fd)
                return self.files[path]
            self.files[path] = opened
            while len(self.files) > self.limit:
                os.close(self.files.popitem(last=False)[1].fd)
        return opened

    def pread(self, f: OpenFile, length: int, offset: int) -> bytes:
        with self.lock:
            return os.pread(f.fd, length, offset)

    def discard(self, path: str, opened: OpenFile) -> None:
        """Closes ``opened`` if it is still the open descriptor of ``path``."""
        with self.lock:
            if self.files.get(path) is opened:
                os.close(self.files.pop(path).fd)

    def close(self, inherited: bool = False) -> None:
        """Closes every descriptor; ``inherited``: in a forked child, whose copy of the lock may be held."""
        if inherited:
            files, self.files = list(self.files.values()), OrderedDict()
        else:
            with self.lock:
                files, self.files = list(self.files.values()), OrderedDict()
        for f in files:
            os.close(f.fd)


def read_local(files: OpenFiles, url: str, path: str, offset: int, length: int) -> bytes:
    """Exactly ``length`` bytes of the local file ``path`` (named ``url`` in errors) from ``offset``.

    Raises:
        ShardReadError: missing, unreadable, or shorter than ``offset + length``.
    """
    try:
        f = files.open(path)
    except FileNotFoundError:
        raise not_found(url) from None
    except OSError as err:
        raise os_error(url, err) from None
    data = files.pread(f, length, offset)
    if len(data) != length:
        raise truncated(url, offset, length, offset + len(data))
    return data
