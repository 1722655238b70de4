"""Random access to shards: :class:`ShardReader` reads ``(url, offset, length)`` ranges, local files with
``pread`` (:mod:`.local`), remote ones through the chunk cache (:mod:`.chunk_cache`).
docs/data.md#remote-shards gives the settings and the measurements."""
import os
import os.path as osp
from typing import Dict, Optional

from .chunk_cache import ChunkThreads, RemoteChunks
from .locations import hf_local, is_hf, is_remote, local_path
from .local import OpenFiles, read_local
from .remote import (DEFAULT_BACKOFF_S, DEFAULT_MAX_BACKOFF_S, DEFAULT_RETRIES, DEFAULT_RETRY_TIMEOUT_S,
                     RetryPolicy)

DEFAULT_CHUNK_BYTES = 16 << 20
DEFAULT_READAHEAD_CHUNKS = 2
DEFAULT_CACHE_BYTES = 16 << 30


class _ProcessState:
    """What a reader holds in one process; made anew in a forked or spawned child (never pickled)."""

    def __init__(self, max_open_files: int):
        self.pid = os.getpid()
        self.files = OpenFiles(max_open_files)
        self.chunks = ChunkThreads()
        self.fingerprints: Dict[str, dict] = {}
        self.hf_local: Dict[str, Optional[str]] = {}

    def close(self):
        self.files.close()
        self.chunks.close()


class ShardReader(RemoteChunks):
    """Reads byte ranges of shards, local or remote; one per dataset, shared by its dataloader workers.

    Picklable: it holds only its settings; each process opens its own files and threads at its first read.

    Args:
        cache_dir: the chunk cache's folder; default :func:`default_cache_dir`.
        cache_bytes: the bound of the whole cache folder; at least ``chunk_bytes * (readahead_chunks + 2)``.
        chunk_bytes: the size of one request.
        readahead_chunks: chunks fetched ahead of the one touched (0: none).
        max_open_files: descriptors kept open per process (shards and chunk files).
        retry_timeout: the longest wait, in seconds, for one request through transient errors.
        retries: an optional cap on the retries of one request (None: ``retry_timeout`` alone bounds them).
        backoff_s: the first wait; each next one doubles, up to ``max_backoff_s``.
    """

    def __init__(self, cache_dir: Optional[str] = None, cache_bytes: int = DEFAULT_CACHE_BYTES,
                 chunk_bytes: int = DEFAULT_CHUNK_BYTES, readahead_chunks: int = DEFAULT_READAHEAD_CHUNKS,
                 max_open_files: int = 32, retries: Optional[int] = DEFAULT_RETRIES,
                 backoff_s: float = DEFAULT_BACKOFF_S, retry_timeout: float = DEFAULT_RETRY_TIMEOUT_S,
                 max_backoff_s: float = DEFAULT_MAX_BACKOFF_S):
        if chunk_bytes <= 0 or readahead_chunks < 0 or max_open_files < 1 or (retries is not None and retries < 0):
            raise ValueError(f'ShardReader: chunk_bytes={chunk_bytes}, readahead_chunks={readahead_chunks}, '
                             f'max_open_files={max_open_files}, retries={retries}: use positive sizes and '
                             f'counts (readahead_chunks and retries may be 0, retries None)')
        if retry_timeout < 0 or backoff_s < 0 or max_backoff_s < 0:
            raise ValueError(f'ShardReader: retry_timeout={retry_timeout}, backoff_s={backoff_s}, max_backoff_s='
                             f'{max_backoff_s}: use seconds >= 0')
        if cache_bytes < chunk_bytes * (readahead_chunks + 2):
            raise ValueError(f'ShardReader: cache_bytes={cache_bytes} holds fewer than readahead_chunks + 2 '
                             f'chunks of {chunk_bytes} bytes; raise cache_bytes or lower chunk_bytes')
        self.cache_dir = cache_dir
        self.cache_bytes = int(cache_bytes)
        self.chunk_bytes = int(chunk_bytes)
        self.readahead_chunks = int(readahead_chunks)
        self.max_open_files = int(max_open_files)
        self.retries = None if retries is None else int(retries)
        self.backoff_s = float(backoff_s)
        self.retry_timeout = float(retry_timeout)
        self.max_backoff_s = float(max_backoff_s)
        self._state_: Optional[_ProcessState] = None

    @property
    def retry(self) -> RetryPolicy:
        """This reader's :class:`RetryPolicy` (also what the index build of its dataset uses)."""
        return RetryPolicy(self.retry_timeout, self.backoff_s, self.max_backoff_s, self.retries)

    def __getstate__(self):  # the settings only
        return {k: v for k, v in self.__dict__.items() if k != '_state_'}

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._state_ = None

    def __repr__(self):
        return (f'ShardReader(cache_dir={self.cache_dir!r}, cache_bytes={self.cache_bytes}, '
                f'chunk_bytes={self.chunk_bytes}, readahead_chunks={self.readahead_chunks}, '
                f'retry_timeout={self.retry_timeout:g})')

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _state(self) -> _ProcessState:
        state = self._state_
        if state is None or state.pid != os.getpid():
            if state is not None:  # a forked child: the descriptors are its own copies; the threads are gone
                state.files.close(inherited=True)
            state = self._state_ = _ProcessState(self.max_open_files)
        return state

    def close(self) -> None:
        """Closes this process's descriptors and stops its read-ahead threads (a later read opens anew)."""
        state = self._state_
        if state is not None and state.pid == os.getpid():
            state.close()
        self._state_ = None

    def read(self, url: str, offset: int, length: int, fingerprint: Optional[dict] = None) -> bytes:
        """Exactly ``length`` bytes of the file at ``url`` from ``offset``.

        Args:
            fingerprint: a remote shard's :func:`fingerprint` (e.g. from its index); default: asked for.

        Raises:
            ShardReadError: the file is missing, shorter than ``offset + length`` (truncated), or cannot be
                reached after the retries.
        """
        if offset < 0 or length < 0:
            raise ValueError(f'{url}: offset={offset}, length={length}: both must be >= 0')
        state = self._state()
        path = self._local_file(state, url)
        if path is not None:
            return read_local(state.files, url, path, offset, length)
        return self._read_remote(state, url, offset, length, fingerprint)

    def _local_file(self, state: _ProcessState, url: str) -> Optional[str]:
        if not is_hf(url):
            return None if is_remote(url) else local_path(url)
        if url not in state.hf_local:
            cached = hf_local(url)
            state.hf_local[url] = osp.realpath(cached) if cached else None
        return state.hf_local[url]
