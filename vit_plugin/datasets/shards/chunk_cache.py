"""The remote chunk cache (docs/data.md#remote-shards): aligned chunks, one request each, as files on the
local disk shared by a node's processes. A chunk file appears only whole; a node fetches a chunk once (a
file lock); the folder stays within ``cache_bytes`` (LRU eviction); read-ahead runs in threads."""
import concurrent.futures
import errno
import hashlib
import json
import os
import os.path as osp
import threading
import time
from typing import Dict, Optional, Tuple

from .errors import ShardReadError, cache_error, truncated
from .listing import fingerprint
from .local import OpenFile, OpenFiles
from .remote import RetryPolicy, fetch_range

_TMP_PREFIX = '.tmp.'
_USAGE_FILE = '.usage'
_STALE_TMP_S = 3600  # a temporary chunk file this old belongs to a writer that died
_EVICT_TO = 0.9  # eviction frees down to this share of the bound, so that it runs once per ~10% written


def default_cache_dir() -> str:
    """``$VIT_PLUGIN_CACHE/shards`` (default ``~/.cache/vit_plugin/shards``), read now."""
    root = os.environ.get('VIT_PLUGIN_CACHE') or osp.join(osp.expanduser('~'), '.cache', 'vit_plugin')
    return osp.join(root, 'shards')


def _digest(text: str, n: int = 16) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:n]


class ChunkThreads:
    """A process's side of the cache for one reader: the read-ahead threads and the chunks being fetched."""

    def __init__(self):
        self.lock = threading.Lock()
        self.pool: Optional[concurrent.futures.ThreadPoolExecutor] = None
        self.inflight: Dict[str, concurrent.futures.Future] = {}
        self.last_chunk: Dict[str, int] = {}
        self.account_lock = threading.Lock()  # the file lock on the cache's total excludes other processes only

    def close(self) -> None:
        with self.lock:
            pool, self.pool = self.pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)


class RemoteChunks:
    """The chunk-cache half of :class:`~vit_plugin.datasets.shards.reader.ShardReader`, on its settings;
    ``state``: the reader's process state (``files``, ``chunks``: :class:`ChunkThreads`, ``fingerprints``)."""
    cache_dir: Optional[str]
    cache_bytes: int
    chunk_bytes: int
    readahead_chunks: int
    retry: RetryPolicy

    @property
    def cache_root(self) -> str:
        return self.cache_dir or default_cache_dir()

    def chunk_folder(self, url: str, fp: dict) -> str:
        """The cache folder of a remote shard's chunks at the version ``fp`` (its fingerprint)."""
        parent, _, name = url.rstrip('/').rpartition('/')
        version = _digest(json.dumps(fp, sort_keys=True, default=str), 12)
        return osp.join(self.cache_root, _digest(parent), f'{name}.{version}')

    def scan_room(self) -> int:
        """The bytes an index build may keep in the cache (what eviction frees down to)."""
        return int(self.cache_bytes * _EVICT_TO)

    def cache_usage(self) -> int:
        """The bytes of the chunk files in the cache folder now (a full scan)."""
        return _cache_usage(self.cache_root)[0]

    def _fingerprint(self, state, url: str, given: Optional[dict]) -> dict:
        if given is not None:
            return given
        if url not in state.fingerprints:
            state.fingerprints[url] = fingerprint(url, self.retry)
        return state.fingerprints[url]

    def _read_remote(self, state, url: str, offset: int, length: int, given: Optional[dict]) -> bytes:
        fp = self._fingerprint(state, url, given)
        size = int(fp['size'])
        if offset + length > size:
            raise truncated(url, offset, length, size)
        folder = self.chunk_folder(url, fp)
        out = bytearray()
        pos, end = offset, offset + length
        chunk = offset // self.chunk_bytes
        while pos < end:
            chunk = pos // self.chunk_bytes
            start = chunk * self.chunk_bytes
            n = min(end, start + self.chunk_bytes) - pos
            f = self._open_chunk(state, url, folder, chunk, min(self.chunk_bytes, size - start), size)
            data = state.files.pread(f, n, pos - start)
            if len(data) != n:  # the chunk's size was checked when it was opened: only a bug ends here
                raise truncated(url, offset, length, start + len(data))
            out += data
            pos += n
        if self.readahead_chunks and state.chunks.last_chunk.get(url) != chunk:
            state.chunks.last_chunk[url] = chunk
            self._read_ahead(state, url, folder, chunk, size)
        return bytes(out)

    def _open_chunk(self, state, url: str, folder: str, chunk: int, expected: int, size: int) -> OpenFile:
        """The open chunk file, from the descriptors already open, the cache folder, or fetched."""
        files: OpenFiles = state.files
        path = self._chunk_path(folder, chunk)
        found = files.get(path)
        if found is not None:
            return found
        for attempt in range(3):
            self._ensure_chunk(state, url, folder, chunk, size)
            try:
                opened = files.open(path)
            except FileNotFoundError:  # evicted between its fetch and its open: fetch it again
                continue
            if opened.size == expected:
                return opened
            files.discard(path, opened)  # a chunk file of another size is no chunk of this version
            _unlink(path)
        raise ShardReadError(url, f'chunk {chunk} vanished from the cache {self.cache_root} as soon as it was '
                                  f'written; raise cache_bytes, or give each job its own cache_dir.')

    def _chunk_path(self, folder: str, chunk: int) -> str:
        return osp.join(folder, f'c{self.chunk_bytes}_{chunk}')

    def _read_ahead(self, state, url: str, folder: str, chunk: int, size: int) -> None:
        threads: ChunkThreads = state.chunks
        last = (size - 1) // self.chunk_bytes
        for ahead in range(chunk + 1, min(chunk + self.readahead_chunks, last) + 1):
            path = self._chunk_path(folder, ahead)
            with threads.lock:
                if path in threads.inflight or path in state.files:
                    continue
                if threads.pool is None:
                    threads.pool = concurrent.futures.ThreadPoolExecutor(
                        max_workers=max(1, self.readahead_chunks), thread_name_prefix='shard-readahead')
                pool = threads.pool
            if not osp.exists(path):
                pool.submit(self._ensure_chunk, state, url, folder, ahead, size, True)

    def _ensure_chunk(self, state, url: str, folder: str, chunk: int, size: int, background: bool = False) -> str:
        """The path of chunk ``chunk``, fetched (once per node) when not in the cache."""
        threads: ChunkThreads = state.chunks
        path = self._chunk_path(folder, chunk)
        if osp.exists(path):
            if not background:
                _touch(path)
            return path
        with threads.lock:
            future = threads.inflight.get(path)
            owner = future is None
            if owner:
                future = threads.inflight[path] = concurrent.futures.Future()
        if not owner:
            try:
                return future.result()
            except Exception:  # noqa: BLE001 (a read-ahead's single try failed: this read tries with its retries)
                if background:
                    return path
                return self._ensure_chunk(state, url, folder, chunk, size)
        try:
            try:
                with FileLock(path + '.lock'):  # the other processes of the node wait for this one's fetch
                    if not osp.exists(path):
                        start = chunk * self.chunk_bytes
                        data = self._fetch(url, start, min(size, start + self.chunk_bytes), background)
                        _write_atomically(path, data)
                        with threads.account_lock:
                            self._account(len(data), keep=path)
            except ShardReadError:
                raise
            except OSError as err:  # the cache folder is full, read-only or gone
                raise cache_error(url, folder, err) from err
            future.set_result(path)
            return path
        except BaseException as err:
            future.set_exception(err)
            if background:
                return path  # the foreground read fetches it again and reports the error
            raise
        finally:
            with threads.lock:
                threads.inflight.pop(path, None)

    def _fetch(self, url: str, start: int, end: int, background: bool = False) -> bytes:
        """Bytes ``[start, end)``, one range request with :attr:`retry` (a read-ahead tries once, quietly)."""
        retry = self.retry._replace(retries=0) if background else self.retry
        data = fetch_range(url, start, end, retry, quiet=background)
        if len(data) != end - start:
            raise truncated(url, start, end - start, start + len(data))
        return data

    def _account(self, added: int, keep: str) -> None:
        """Adds ``added`` bytes to the node's running total, and evicts past ``cache_bytes``."""
        root = self.cache_root
        with FileLock(osp.join(root, _USAGE_FILE)) as fd:
            raw = os.pread(fd, 32, 0)
            try:
                total = int(raw) + added
            except ValueError:  # a new file: count what is there
                total = _cache_usage(root)[0]
            if total > self.cache_bytes:
                total = _evict(root, int(self.cache_bytes * _EVICT_TO), keep)
            os.ftruncate(fd, 0)
            os.pwrite(fd, str(total).encode(), 0)


# The folder on disk --------------------------------------------------------------------------------------

def _touch(path: str) -> None:
    """Marks a chunk as used now (its modification time orders the eviction)."""
    try:
        os.utime(path)
    except OSError:
        pass  # evicted meanwhile, or a read-only cache: the order is a hint


def _write_atomically(path: str, data: bytes) -> None:
    tmp = f'{osp.dirname(path)}/{_TMP_PREFIX}{osp.basename(path)}.{os.getpid()}.{threading.get_ident()}'
    try:
        with open(tmp, 'wb') as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


class FileLock:
    """An exclusive lock on a file (created when missing), between the processes of a node.

    A POSIX record lock (``lockf``): a forked child does not inherit it, as it would a ``flock``. It does
    not exclude the threads of one process from each other: the callers do that.
    """

    def __init__(self, path: str):
        self.path = path
        self.fd = -1

    def __enter__(self) -> int:
        import fcntl  # POSIX only
        os.makedirs(osp.dirname(self.path), exist_ok=True)
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        while True:
            try:
                fcntl.lockf(self.fd, fcntl.LOCK_EX)
                return self.fd
            except OSError as err:
                # The kernel sees a process, not a thread, wait for a lock: two processes whose threads each
                # hold one chunk and wait for the other's look like a deadlock, but each holder finishes.
                if err.errno != errno.EDEADLK:
                    os.close(self.fd)
                    raise
                time.sleep(0.005)

    def __exit__(self, *exc):
        if self.fd >= 0:
            os.close(self.fd)  # releases the lock
            self.fd = -1


def _chunk_files(root: str):
    """(mtime, size, path) of every chunk file under ``root``; removes dead writers' temporary files."""
    now = time.time()
    found = []
    for level1 in _scandir(root):
        if not level1.is_dir():
            continue
        for level2 in _scandir(level1.path):
            if not level2.is_dir():
                continue
            for entry in _scandir(level2.path):
                try:
                    stat = entry.stat()
                except FileNotFoundError:
                    continue
                if entry.name.startswith(_TMP_PREFIX):
                    if now - stat.st_mtime > _STALE_TMP_S:
                        _unlink(entry.path)
                elif not entry.name.endswith('.lock'):
                    found.append((stat.st_mtime_ns, stat.st_size, entry.path))
    return found


def _scandir(path: str):
    try:
        with os.scandir(path) as it:
            return list(it)
    except (FileNotFoundError, NotADirectoryError):
        return []


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _cache_usage(root: str) -> Tuple[int, int]:
    files = _chunk_files(root)
    return sum(size for _, size, _ in files), len(files)


def _evict(root: str, target: int, keep: str) -> int:
    """Deletes the least recently used chunks (never ``keep``) down to ``target`` bytes; returns the rest."""
    files = sorted(_chunk_files(root))
    total = sum(size for _, size, _ in files)
    for _, size, path in files:
        if total <= target:
            break
        if path == keep:
            continue
        _unlink(path)
        _unlink(path + '.lock')
        total -= size
    return total
