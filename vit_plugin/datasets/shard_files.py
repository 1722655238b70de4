"""The bytes of tar shards, local or remote: listing, versions, sequential scans and random-access reads.

Everything above this module (the tar index, the shard dataset) names a shard by a URL and reads it
through these functions; docs/data.md#remote-shards tells the story (the cache, its settings, measurements).

* **Where.** A local path (or ``file://``), or any fsspec URL: ``s3://`` and ``gs://`` (with ``s3fs`` /
  ``gcsfs`` installed), ``http(s)://`` (``aiohttp``), and ``hf://datasets/<org>/<name>[@rev]/<path>``
  through ``huggingface_hub``. Credentials come from the environment, as each library reads them
  (``AWS_*``, ``GOOGLE_APPLICATION_CREDENTIALS``, ``HF_TOKEN`` / ``huggingface-cli login``); fsspec's
  ``FSSPEC_<PROTOCOL>_<OPTION>`` variables set a file system's options.
* **hf://.** A file already in the local Hugging Face cache (``huggingface-cli download`` without
  ``--local-dir``) is read from there, online or not; only the others go to the hub. Offline
  (``HF_HUB_OFFLINE=1``, read at each call, or the hub unreachable) an uncached file is a
  :class:`ShardReadError` that names the repository and the ``huggingface-cli download`` command.
* **Versions.** :func:`fingerprint` (one file) and :func:`fingerprints_in_folder` (one listing) say
  what identifies a shard's current content: size and modification time locally, size plus what the
  store gives remotely (ETag, Last-Modified, an LFS sha256 or git blob id on the hub). The same hub
  file gives the same fingerprint from the hub and from the cache.
* **Scans.** :func:`open_for_scan` returns a seekable binary file for :mod:`tarfile` to walk the headers:
  remotely with a large read-ahead block, so a 1 GB shard costs about ``size / block_bytes`` requests;
  or through a :class:`ShardReader`'s chunk cache (``keep_in``), whose chunks then serve the first reads.
* **Random access.** :class:`ShardReader` reads ``(url, offset, length)`` ranges, as dataloader
  workers do: local files with ``os.pread`` on a few open descriptors; remote files through a chunk
  cache on the local disk (aligned chunks of ``chunk_bytes``, one request each; a bounded folder with
  least-recently-used eviction, shared by every worker and rank of a node; chunk files appear only
  whole, written to a temporary name and moved into place) with a background read-ahead of the next
  chunks of the same shard.
* **Ranges.** Every remote read is a byte-range request; a server that answers one with the whole file
  (HTTP ``200`` instead of ``206``, as Python's ``http.server`` does) is refused at its first read
  (:class:`RangesNotSupportedError`), before any whole-file transfer is repeated.
* **Outages.** A transient error (network, timeout, HTTP 5xx or 429) is retried with exponential
  back-off and jitter for up to ``retry_timeout`` seconds in all (:class:`RetryPolicy`; 600 by default),
  one log line per back-off step; what cannot heal (404, 401, 403, 416, a size mismatch) fails at once.
* **Errors.** Whatever cannot be read (missing, truncated, permission, network after ``retry_timeout``,
  offline) is a :class:`ShardReadError` (an ``OSError``) naming the URL and what to do.
"""
import concurrent.futures
import datetime
import errno
import hashlib
import io
import json
import logging
import os
import os.path as osp
import posixpath
import random
import re
import shlex
import threading
import time
import urllib.parse
from collections import OrderedDict
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple

from vit_plugin import runtime
from mmengine.logging import print_log

from vit_plugin.checkpoint.hub import hub_cache_dir, hub_offline

LOCAL_PROTOCOLS = ('file', 'local')
COMPRESSED_TAR_SUFFIXES = ('.tar.gz', '.tgz', '.tar.bz2', '.tbz2', '.tar.xz', '.txz', '.tar.zst', '.tar.zstd')
HF_REPO_TYPES = {'datasets': 'dataset', 'spaces': 'space'}  # the URL prefix of a repository type; else a model

DEFAULT_CHUNK_BYTES = 16 << 20
DEFAULT_READAHEAD_CHUNKS = 2
DEFAULT_CACHE_BYTES = 16 << 30
DEFAULT_SCAN_BLOCK_BYTES = 16 << 20
DEFAULT_RETRIES = None  # no cap on the count of tries: retry_timeout bounds them
DEFAULT_BACKOFF_S = 0.5
DEFAULT_MAX_BACKOFF_S = 60.0
DEFAULT_RETRY_TIMEOUT_S = 600.0

_TMP_PREFIX = '.tmp.'
_USAGE_FILE = '.usage'
_STALE_TMP_S = 3600  # a temporary chunk file this old belongs to a writer that died
_EVICT_TO = 0.9  # eviction frees down to this share of the bound, so that it runs once per ~10% written
_SPECIAL_REFS = re.compile(r'^refs/(convert/\w+|pr/\d+)')
_COMMIT = re.compile(r'^[0-9a-f]{40}$')
# What the fsspec stores put in info() / ls() that changes with a file's content: HTTP headers, s3fs
# (ETag, LastModified, VersionId), gcsfs (generation, md5Hash, crc32c, updated), adlfs (etag,
# last_modified), local-like stores (mtime).
_VERSION_KEYS = ('ETag', 'etag', 'Last-Modified', 'LastModified', 'last_modified', 'VersionId', 'version_id',
                 'generation', 'md5Hash', 'crc32c', 'Content-MD5', 'updated', 'mtime')


class ShardReadError(OSError):
    """A shard, a byte range of it, or a folder of shards cannot be read.

    Attributes:
        url: what was read.
        reason: what went wrong (missing, truncated, permission denied, network error after the retries,
            offline without a cached copy), with what to do.
    """

    def __init__(self, url: str, reason: str = ''):
        self.url = url
        self.reason = reason
        super().__init__(f'{url}: {reason}' if reason else url)

    def __reduce__(self):  # the (url, reason) pair survives pickling (dataloader workers)
        return type(self), (self.url, self.reason)


class ShardNotFoundError(ShardReadError, FileNotFoundError):
    """The file (or folder) does not exist."""


class HubOfflineError(ShardReadError):
    """An hf:// file that is not in the local Hugging Face cache while the hub is offline or unreachable."""


class ShardUnavailableError(ShardReadError):
    """A transient error (network, timeout, HTTP 5xx or 429) that lasted past the retry policy's
    ``timeout_s``: the store is down, not the shard damaged."""


class RangesNotSupportedError(ShardReadError):
    """The server answers a byte-range request with the whole file (HTTP 200, not 206 Partial Content).

    Random access (and the index scan) would then move the whole shard for every chunk; the reader refuses
    at the first such answer instead.
    """


class RetryPolicy(NamedTuple):
    """How long remote reads wait out transient errors (network, timeout, HTTP 5xx or 429).

    The n-th wait (from 0) is ``min(max_backoff_s, backoff_s * 2 ** n)`` times a random factor in
    ``[0.5, 1]`` (jitter: the processes of a job do not retry in step); the waits stop when
    ``timeout_s`` has passed since the first failure, or after ``retries`` retries when that is set.

    Attributes:
        timeout_s: the longest total wait for one request, in seconds (600: a few minutes of outage).
        backoff_s: the first wait.
        max_backoff_s: the longest single wait.
        retries: an optional cap on the count of retries (None: ``timeout_s`` alone bounds them).
    """
    timeout_s: float = DEFAULT_RETRY_TIMEOUT_S
    backoff_s: float = DEFAULT_BACKOFF_S
    max_backoff_s: float = DEFAULT_MAX_BACKOFF_S
    retries: Optional[int] = DEFAULT_RETRIES

    def delay(self, step: int) -> float:
        """The wait before retry ``step`` (0 for the first), jitter included."""
        return min(self.max_backoff_s, self.backoff_s * 2 ** min(step, 60)) * random.uniform(0.5, 1.0)


DEFAULT_RETRY = RetryPolicy()


# Where a URL points ------------------------------------------------------------------------------------

def _protocol(url: str) -> Optional[str]:
    if '://' not in url:
        return None
    protocol = url.split('://', 1)[0]
    return protocol.split('::')[-1] if '::' in protocol else protocol  # "simplecache::s3://": s3


def is_remote(url: str) -> bool:
    """Whether ``url`` is read through fsspec (any protocol but ``file``/``local``), e.g. ``s3://``, ``hf://``."""
    protocol = _protocol(url)
    return protocol is not None and len(protocol) > 1 and protocol not in LOCAL_PROTOCOLS


def local_path(url: str) -> str:
    """The file-system path of a local ``url`` (a plain path, or ``file://`` / ``local://``)."""
    for protocol in LOCAL_PROTOCOLS:
        prefix = protocol + '://'
        if url.startswith(prefix):
            return url[len(prefix):]
    return url


def join_url(base: str, name: str) -> str:
    """``name`` (relative, ``/``-separated) inside the folder ``base`` (a local path or a URL).

    A ``name`` that is itself absolute (a URL, or an absolute local path for a local ``base``) is returned
    as it is, as ``os.path.join`` does.
    """
    if is_remote(name):
        return name
    if is_remote(base) or _protocol(base) in LOCAL_PROTOCOLS:
        return base.rstrip('/') + '/' + name.lstrip('/')
    return osp.join(base, *name.split('/'))


def is_compressed_tar(name: str) -> bool:
    """Whether a file name is a compressed tar (``.tar.gz``, ``.tgz``, ``.tar.zst``...), which has no random
    access: such a shard must be decompressed first."""
    return name.lower().endswith(COMPRESSED_TAR_SUFFIXES)


# hf:// ------------------------------------------------------------------------------------------------

class HfPath(NamedTuple):
    """Where an ``hf://`` URL points on the Hugging Face hub."""
    repo_type: str  # 'dataset', 'model' or 'space'
    repo_id: str  # '<org>/<name>'
    revision: str  # a branch, tag or commit; 'main' when the URL names none
    path_in_repo: str  # '' for the repository's root


def _is_hf(url: str) -> bool:
    return url.startswith('hf://')


def resolve_hf_url(url: str) -> HfPath:
    """Split ``hf://[datasets/|spaces/]<org>/<name>[@<revision>][/<path>]`` without asking the hub.

    The revision may be URL-quoted (``@refs%2Fpr%2F3``) or a special ref (``@refs/pr/3/<path>``).

    Raises:
        ValueError: not an ``hf://`` URL of an ``<org>/<name>`` repository.
    """
    if not _is_hf(url):
        raise ValueError(f'{url}: not an hf:// URL (hf://datasets/<org>/<name>/<path>)')
    rest = url[len('hf://'):].strip('/')
    first, _, tail = rest.partition('/')
    repo_type = HF_REPO_TYPES.get(first)
    if repo_type is None:
        repo_type, tail = 'model', rest
    parts = tail.split('/', 2)
    if len(parts) < 2 or not parts[0] or not parts[1] or parts[1].startswith('@'):
        raise ValueError(f'{url}: expected hf://datasets/<org>/<name>[@<revision>]/<path>, '
                         f'e.g. hf://datasets/timm/imagenet-1k-wds/imagenet1k-train-0000.tar')
    org, name_rev, path = parts[0], parts[1], parts[2] if len(parts) == 3 else ''
    name, at, revision = name_rev.partition('@')
    if at:
        revision = urllib.parse.unquote(revision)
        special = _SPECIAL_REFS.match(f'{revision}/{path}') if revision == 'refs' else None
        if special:  # "@refs/pr/3/<path>": the revision holds slashes
            revision = special.group()
            path = f'refs/{path}'[len(revision):].lstrip('/')
    return HfPath(repo_type, f'{org}/{name}', revision or 'main', path)


def _hf_repo_folder(hf: HfPath) -> str:
    return osp.join(hub_cache_dir(), f'{hf.repo_type}s--' + hf.repo_id.replace('/', '--'))


def hf_cached_snapshot(hf: HfPath) -> Optional[str]:
    """The cached snapshot folder of ``hf``'s repository at its revision, None when not in the local Hugging
    Face cache (``HF_HUB_CACHE`` / ``HF_HOME``, read now)."""
    folder = _hf_repo_folder(hf)
    commit = hf.revision if _COMMIT.match(hf.revision) else None
    if commit is None:
        try:
            with open(osp.join(folder, 'refs', *hf.revision.split('/'))) as f:
                commit = f.read().strip()
        except OSError:
            return None
    snapshot = osp.join(folder, 'snapshots', commit)
    return snapshot if osp.isdir(snapshot) else None


def hf_cached_path(hf: HfPath) -> Optional[str]:
    """The local path of ``hf`` (a file or a folder) in the Hugging Face cache, None when it is not there."""
    snapshot = hf_cached_snapshot(hf)
    if snapshot is None:
        return None
    path = osp.join(snapshot, *[p for p in hf.path_in_repo.split('/') if p])
    return path if osp.exists(path) else None


def _hf_download_hint(hf: HfPath) -> str:
    flag = f' --repo-type {hf.repo_type}' if hf.repo_type != 'model' else ''
    rev = f' --revision {hf.revision}' if hf.revision != 'main' else ''
    return (f'Run `huggingface-cli download {hf.repo_id}{flag}{rev} --local-dir DIR` where the hub is '
            f'reachable, then point data_root at DIR.')


def _hf_unavailable(url: str, hf: HfPath, why: str) -> 'HubOfflineError':
    return HubOfflineError(url, f'{why}; {hf.repo_id} is not in the local Hugging Face cache '
                               f'({hub_cache_dir()}).\n{_hf_download_hint(hf)}')


def _hf_local(url: str) -> Optional[str]:
    """The cached copy of an hf:// URL, or None; offline without one, the error that says so."""
    hf = resolve_hf_url(url)
    cached = hf_cached_path(hf)
    if cached is None and hub_offline():
        raise _hf_unavailable(url, hf, 'HF_HUB_OFFLINE is set')
    return cached


def _hf_endpoint() -> str:
    """``HF_ENDPOINT`` read now (huggingface_hub reads it once, at import)."""
    from huggingface_hub import constants
    return os.environ.get('HF_ENDPOINT') or constants.ENDPOINT


def _hf_fs():
    from huggingface_hub import HfFileSystem
    return HfFileSystem(endpoint=_hf_endpoint())


def _hf_fs_path(hf: HfPath) -> str:
    prefix = {'dataset': 'datasets/', 'space': 'spaces/'}.get(hf.repo_type, '')
    revision = '' if hf.revision == 'main' else '@' + urllib.parse.quote(hf.revision, safe='')
    return f'{prefix}{hf.repo_id}{revision}' + (f'/{hf.path_in_repo}' if hf.path_in_repo else '')


def _hf_fetch(hf: HfPath, start: Optional[int] = None, end: Optional[int] = None) -> bytes:
    """One GET of a hub file (a byte range of it when ``start``/``end`` are given)."""
    from huggingface_hub import constants, hf_hub_url
    from huggingface_hub.utils import build_hf_headers, get_session, hf_raise_for_status
    headers = build_hf_headers()
    if start is not None:
        headers['Range'] = f'bytes={start}-{end - 1}'
    url = hf_hub_url(hf.repo_id, hf.path_in_repo, repo_type=hf.repo_type, revision=hf.revision,
                     endpoint=_hf_endpoint())
    ranged = start is not None
    response = get_session().get(url, headers=headers, timeout=constants.HF_HUB_DOWNLOAD_TIMEOUT, stream=ranged)
    try:
        hf_raise_for_status(response)
        length = response.headers.get('Content-Length')
        if ranged and response.status_code != 206 and not (start == 0 and length and int(length) <= end):
            raise _no_ranges(url, response.status_code)
        return response.content
    finally:
        response.close()


# Errors and retries -------------------------------------------------------------------------------------

def _status(err: BaseException) -> Optional[int]:
    """The HTTP status of an aiohttp (fsspec's http) or requests (huggingface_hub) error; None for others."""
    try:
        import aiohttp
        if isinstance(err, aiohttp.ClientResponseError):
            return err.status
    except ImportError:
        pass
    try:
        import requests
        if isinstance(err, requests.HTTPError) and err.response is not None:
            return err.response.status_code
    except ImportError:
        pass
    return None


def _transient_errors() -> Tuple[type, ...]:
    found: List[type] = [ConnectionError, TimeoutError]
    try:
        import aiohttp
        found.append(aiohttp.ClientError)
    except ImportError:
        pass
    try:
        import requests
        found += [requests.ConnectionError, requests.Timeout, requests.exceptions.ChunkedEncodingError]
    except ImportError:
        pass
    return tuple(found)


class _BeyondEnd(Exception):
    """A range that starts at or past the end of the file (HTTP 416)."""


def _permanent(url: str, err: BaseException) -> Optional[BaseException]:
    """The error to raise at once for ``err`` (no retry can help), or None for a transient one."""
    status = _status(err)
    if status == 416:
        return _BeyondEnd()
    if isinstance(err, FileNotFoundError) or status in (404, 410):
        return ShardNotFoundError(url, 'not found. Check the path (data_root, the shard list or pattern).')
    if isinstance(err, PermissionError) or status in (401, 403):
        return ShardReadError(url, 'permission denied (or a private, gated or missing repository): check the '
                                   'name and the credentials (`huggingface-cli login`, AWS_PROFILE...).')
    if status is not None and 400 <= status < 500 and status not in (408, 425, 429):
        return ShardReadError(url, f'HTTP {status} ({_brief(err)}).')
    if isinstance(err, ImportError):  # fsspec names the package a protocol needs
        return ShardReadError(url, f'{err}')
    if status is None and not isinstance(err, _transient_errors()):
        return ShardReadError(url, _brief(err))
    return None


def _brief(err: BaseException, limit: int = 160) -> str:
    """``'Type: message'`` cut to ``limit`` characters: a network library's message can run long."""
    text = f'{type(err).__name__}: {err}'.replace('\n', ' ')
    return text if len(text) <= limit else text[:limit - 3] + '...'


def _with_retries(url: str, call: Callable[[], Any], retry: Optional[RetryPolicy] = None,
                  quiet: bool = False) -> Any:
    """``call()``, again after a transient error (network, timeout, HTTP 5xx/429), with the back-off of
    ``retry`` (default :data:`DEFAULT_RETRY`); each wait logs one line unless ``quiet``.

    Raises:
        ShardReadError: a permanent error (at once).
        ShardUnavailableError: a transient error that lasted past ``retry.timeout_s``.
        _BeyondEnd: the range starts past the end of the file.
    """
    retry = retry or DEFAULT_RETRY
    deadline = None
    step = 0
    while True:
        try:
            return call()
        except ShardReadError:
            raise
        except Exception as err:  # noqa: BLE001 (sorted into permanent and transient below)
            permanent = _permanent(url, err)
            if permanent is not None:
                raise permanent from err
            now = time.monotonic()
            if deadline is None:
                deadline, first = now + retry.timeout_s, now
            left = deadline - now
            if left <= 0 or (retry.retries is not None and step >= retry.retries):
                raise ShardUnavailableError(
                    url, f'{_brief(err)} ({step + 1} tries over {now - first:.0f} s; retry_timeout='
                         f'{retry.timeout_s:g}). Check the network and the store, then resume the run (--resume).'
                ) from err
            delay = min(retry.delay(step), left)
            if not quiet:
                print_log(f'{url}: {_brief(err, 100)}; trying again in {delay:.1f} s (waited {now - first:.0f} s '
                          f'of retry_timeout={retry.timeout_s:g})', logger='current', level=logging.WARNING)
            time.sleep(delay)
            step += 1


def _hf_call(url: str, hf: HfPath, call: Callable[[], Any], retry: Optional[RetryPolicy] = None,
             quiet: bool = False) -> Any:
    """:func:`_with_retries` for the hub: a hub that cannot be reached is the error that says how to
    download the repository."""
    try:
        return _with_retries(url, call, retry, quiet)
    except ShardReadError as err:
        cause = err.__cause__
        if cause is not None and _status(cause) is None and isinstance(cause, _transient_errors()):
            raise _hf_unavailable(url, hf, f'the hub cannot be reached ({type(cause).__name__})') from cause
        raise


def _no_ranges(url: str, status: int) -> RangesNotSupportedError:
    return RangesNotSupportedError(
        url, f'the server answers a byte-range request with HTTP {status} and the whole file, not 206 '
             f'Partial Content.\nServe the shards from a server with Range support (docs/data.md#remote-shards), '
             f'or download them and point data_root at the local folder.')


def _http_range(fs, path: str, url: str, start: int, end: int) -> bytes:
    """Bytes ``[start, end)`` of an http(s) file, one GET with a ``Range`` header whose answer must be
    ``206`` (or ``200`` with no more than the range: a file that ends inside it). A ``200`` with the whole
    file is refused before its body is read."""
    from fsspec.asyn import sync

    async def get():
        client = await fs.set_session()  # aiohttp's ClientSession
        kwargs = dict(fs.kwargs)
        headers = dict(kwargs.pop('headers', None) or {})
        headers['Range'] = f'bytes={start}-{end - 1}'
        async with client.get(fs.encode_url(path), headers=headers, **kwargs) as response:
            if response.status == 404:
                raise FileNotFoundError(url)
            response.raise_for_status()  # aiohttp's error, with the status _permanent sorts
            length = response.content_length
            if response.status != 206 and not (start == 0 and length is not None and length <= end - start):
                raise _no_ranges(url, response.status)
            return await response.read()
    return sync(fs.loop, get)


def _fetch_range(url: str, start: int, end: int, retry: Optional[RetryPolicy] = None,
                 quiet: bool = False) -> bytes:
    """Bytes ``[start, end)`` of a remote file (fewer at its end): one range request, plus retries.

    Raises:
        RangesNotSupportedError: the store answered with more than the range (it ignores ``Range``).
        ShardReadError: as :func:`_with_retries`.
    """
    try:
        if _is_hf(url):
            hf = resolve_hf_url(url)
            data = _hf_call(url, hf, lambda: _hf_fetch(hf, start, end), retry, quiet)
        else:
            fs, path = _fsspec(url)
            if _protocol(url) in ('http', 'https'):
                data = _with_retries(url, lambda: _http_range(fs, path, url, start, end), retry, quiet)
            else:
                data = _with_retries(url, lambda: fs.cat_file(path, start=start, end=end), retry, quiet)
    except _BeyondEnd:
        return b''
    if len(data) > end - start:  # a store that ignores the range: refused before a second such transfer
        raise _no_ranges(url, 200)
    return data


#: This process's fsspec file systems, by protocol. They are made with ``skip_instance_cache`` so that this
#: module alone holds them, and decides what a forked child does with them (:func:`_after_fork_in_child`,
#: installed with the first of them and kept while the process holds them).
_FILE_SYSTEMS: Dict[str, Any] = {}
#: A forked child's copies of its parent's file systems: kept, never used, never closed.
_INHERITED: List[Any] = []
_FORK_HOOK = 'vit_plugin.datasets.shard_files:_after_fork_in_child'


def _after_fork_in_child() -> None:
    """A forked child (a data-loader or index worker) leaves its parent's file systems alone.

    An HTTP file system holds an aiohttp ClientSession whose sockets the parent's event loop watches through
    one epoll set, which a forked child shares. Were the child to close its copy (fsspec does so when a
    child drops the parent's instances), it would remove the parent's sockets from that set, and the
    parent's next remote read would wait for aiohttp's 5-minute timeout. The child keeps the copies
    untouched and opens file systems of its own.
    """
    _INHERITED.extend(_FILE_SYSTEMS.values())
    _FILE_SYSTEMS.clear()


def _fsspec(url: str):
    """(file system, path) of a remote, non-hf URL."""
    import fsspec
    try:
        if '::' in url:  # a chained URL (e.g. simplecache::s3://...): fsspec's own instances
            return fsspec.core.url_to_fs(url)
        protocol = fsspec.core.split_protocol(url)[0]
        fs = _FILE_SYSTEMS.get(protocol)
        if fs is None:
            fs = fsspec.filesystem(protocol, skip_instance_cache=True)
            runtime.install_fork_hook(_FORK_HOOK, _after_fork_in_child)
            _FILE_SYSTEMS[protocol] = fs
        return fs, fsspec.core.strip_protocol(url)
    except ImportError as err:
        raise ShardReadError(url, f'{err}') from None
    except ValueError as err:  # an unknown protocol
        raise ShardReadError(url, f'{err}; install the fsspec implementation of this protocol.') from None


# Folders, small files, versions ----------------------------------------------------------------------------

class FolderListing(NamedTuple):
    """What :func:`list_folder` found directly in a folder (one listing call remotely)."""
    shards: List[str]  # the names with one of the asked suffixes, sorted
    compressed: List[str]  # compressed tars (is_compressed_tar), sorted: to decompress before use
    fingerprints: Dict[str, dict]  # name -> fingerprint, for the shards the listing described fully


def _hf_fingerprint(size: int, lfs: Optional[dict], blob_id: Optional[str]) -> dict:
    if lfs:  # huggingface_hub's BlobLfsInfo is a dict
        return {'size': int(size), 'sha256': lfs['sha256']}
    return {'size': int(size), 'blob_id': blob_id}


def _cached_hf_fingerprint(path: str) -> dict:
    """The fingerprint of a file in the Hugging Face cache: its blob's name is the LFS sha256 (64 hex
    digits) or the git blob id (40), the same values the hub lists."""
    blob = osp.basename(osp.realpath(path))
    size = os.stat(path).st_size
    return {'size': size, 'sha256': blob} if len(blob) == 64 else {'size': size, 'blob_id': blob}


def _remote_fingerprint(info: Dict[str, Any]) -> Optional[dict]:
    """A JSON-serialisable fingerprint from an fsspec ``info``/``ls`` entry; None without a size."""
    if info.get('size') is None:
        return None
    out: Dict[str, Any] = {'size': int(info['size'])}
    for key in _VERSION_KEYS:
        value = info.get(key)
        if isinstance(value, datetime.datetime):
            out[key] = value.isoformat()
        elif isinstance(value, (int, float, str)):
            out[key] = value
        elif value is not None:
            out[key] = str(value)
    return out


def _local_fingerprint(stat: os.stat_result) -> dict:
    return {'size': stat.st_size, 'mtime_ns': stat.st_mtime_ns}


def _list_local(url: str, folder: str) -> List[Tuple[str, Optional[dict]]]:
    entries = []
    try:
        with os.scandir(folder) as it:
            for entry in it:
                if entry.is_file():
                    fp = _cached_hf_fingerprint(entry.path) if _is_hf(url) else _local_fingerprint(entry.stat())
                    entries.append((entry.name, fp))
    except (FileNotFoundError, NotADirectoryError):
        raise ShardNotFoundError(url, 'folder not found. Check data_root (or the shard folder).') from None
    except PermissionError:
        raise ShardReadError(url, 'permission denied while listing the folder.') from None
    return entries


def _list_hf(url: str, retry: Optional[RetryPolicy]) -> List[Tuple[str, Optional[dict]]]:
    hf = resolve_hf_url(url)
    fs = _hf_fs()

    def ls():
        fs.invalidate_cache()
        return fs.ls(_hf_fs_path(hf), detail=True)
    return [(posixpath.basename(item['name']), _hf_fingerprint(item['size'], item.get('lfs'), item.get('blob_id')))
            for item in _hf_call(url, hf, ls, retry) if item['type'] == 'file']


def list_folder(url: str, suffixes: Sequence[str] = ('.tar',), retry: Optional[RetryPolicy] = None
                ) -> FolderListing:
    """The shards (files ending with one of ``suffixes``) and the compressed tars directly in a folder.

    Remotely this is one listing call; the fingerprints come with it where the store lists sizes (s3, gs,
    the hub; not a plain HTTP index page, see :func:`fingerprints_in_folder`).

    Raises:
        ShardReadError: the folder does not exist or cannot be listed.
    """
    suffixes = tuple(s.lower() for s in suffixes)
    entries: List[Tuple[str, Optional[dict]]] = []
    if not is_remote(url):
        entries = _list_local(url, local_path(url))
    elif _is_hf(url):  # the hub's listing (complete), else the cached snapshot's (what was downloaded)
        hf = resolve_hf_url(url)
        try:
            if hub_offline():
                raise _hf_unavailable(url, hf, 'HF_HUB_OFFLINE is set')
            entries = _list_hf(url, retry)
        except HubOfflineError:
            cached = hf_cached_path(hf)
            if cached is None or not osp.isdir(cached):
                raise
            entries = _list_local(url, cached)
    else:
        fs, path = _fsspec(url)

        def ls():
            fs.invalidate_cache(path)
            return fs.ls(path, detail=True)
        for item in _with_retries(url, ls, retry):
            if item.get('type') != 'directory' and not item['name'].endswith('/'):
                name = urllib.parse.unquote(posixpath.basename(item['name'].rstrip('/')))
                entries.append((name, _remote_fingerprint(item)))
    shards = sorted(name for name, _ in entries if name.lower().endswith(suffixes))
    wanted = set(shards)
    fingerprints = {name: fp for name, fp in entries if fp is not None and name in wanted}
    return FolderListing(shards, sorted(name for name, _ in entries if is_compressed_tar(name)), fingerprints)


def list_shards_in_folder(url: str, suffixes: Sequence[str] = ('.tar',),
                          retry: Optional[RetryPolicy] = None) -> List[str]:
    """The sorted names (relative to ``url``) of the files directly in a folder that end with ``suffixes``.

    Compressed tars are not among them (``.tar.gz`` does not end with ``.tar``); :func:`list_folder` or
    :func:`compressed_tars_in_folder` name them, for an error that says to decompress them first.
    """
    return list_folder(url, suffixes, retry).shards


def compressed_tars_in_folder(url: str, retry: Optional[RetryPolicy] = None) -> List[str]:
    """The sorted names of the compressed tars (:data:`COMPRESSED_TAR_SUFFIXES`) directly in a folder."""
    return list_folder(url, (), retry).compressed


def fingerprint(url: str, retry: Optional[RetryPolicy] = None) -> dict:
    """What identifies the current content of the file at ``url`` (JSON-serialisable, compare with ``==``).

    Local: ``{'size', 'mtime_ns'}``. Remote: ``{'size'}`` plus what the store gives (ETag, Last-Modified,
    generation...); on the hub ``{'size', 'sha256'}`` (LFS files) or ``{'size', 'blob_id'}``. One request.

    Raises:
        ShardReadError: the file does not exist or cannot be reached.
    """
    if _is_hf(url):
        cached = _hf_local(url)
        if cached is not None:
            return _cached_hf_fingerprint(cached)
        hf = resolve_hf_url(url)
        fs = _hf_fs()
        info = _hf_call(url, hf, lambda: fs.info(_hf_fs_path(hf), refresh=True), retry)
        if info['type'] != 'file':
            raise ShardReadError(url, 'a folder, not a file.')
        return _hf_fingerprint(info['size'], info.get('lfs'), info.get('blob_id'))
    if not is_remote(url):
        try:
            stat = os.stat(local_path(url))
        except FileNotFoundError:
            raise ShardNotFoundError(url, 'not found. Check the path (data_root, the shard list or pattern).'
                                 ) from None
        except OSError as err:
            raise ShardReadError(url, f'{err.strerror}.') from None
        return _local_fingerprint(stat)
    fs, path = _fsspec(url)

    def info():
        fs.invalidate_cache(path)
        return fs.info(path)
    found = _remote_fingerprint(_with_retries(url, info, retry))
    if found is None:
        raise ShardReadError(url, 'the server gives no size (Content-Length); ranges cannot be read.')
    return found


def fingerprints_in_folder(url: str, suffixes: Sequence[str] = ('.tar',),
                           retry: Optional[RetryPolicy] = None) -> Dict[str, dict]:
    """``{name: fingerprint}`` of the shards directly in a folder: one listing call where the store lists
    sizes and versions (local folders, s3, gs, the hub), plus one request per shard where it does not (a
    plain HTTP index page)."""
    listing = list_folder(url, suffixes, retry)
    out = dict(listing.fingerprints)
    for name in listing.shards:
        if name not in out:
            out[name] = fingerprint(join_url(url, name), retry)
    return out


def read_small_file(url: str, retry: Optional[RetryPolicy] = None) -> Optional[bytes]:
    """The whole content of a small file (e.g. ``_info.json``), None when it does not exist.

    Raises:
        ShardReadError: it exists but cannot be read (permission, network after the retries, offline
            with its repository not in the cache).
    """
    if _is_hf(url):
        hf = resolve_hf_url(url)
        cached = hf_cached_path(hf)
        if cached is None and hub_offline():
            if hf_cached_snapshot(hf) is None:
                raise _hf_unavailable(url, hf, 'HF_HUB_OFFLINE is set')
            return None  # the repository is cached, this file is not part of it
        if cached is None:
            try:
                return _hf_call(url, hf, lambda: _hf_fetch(hf), retry)
            except ShardNotFoundError:
                return None
        url, path = cached, cached
    else:
        path = None if is_remote(url) else local_path(url)
    if path is not None:
        try:
            with open(path, 'rb') as f:
                return f.read()
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as err:
            raise ShardReadError(url, f'{err.strerror}.') from None
    fs, fs_path = _fsspec(url)
    try:
        return _with_retries(url, lambda: fs.cat_file(fs_path), retry)
    except ShardNotFoundError:
        return None


def open_for_scan(url: str, block_bytes: int = DEFAULT_SCAN_BLOCK_BYTES, retry: Optional[RetryPolicy] = None,
                  keep_in: Optional['ShardReader'] = None, version: Optional[dict] = None):
    """A seekable binary file over the shard at ``url``, for :mod:`tarfile` to read its headers in order.

    Local (and cached hf://) files are opened plainly. A remote file is read in byte ranges of at least
    ``block_bytes`` from the position read (a read-ahead block: forward seeks inside it cost nothing), so a
    scan costs about ``size / block_bytes`` requests, each retried as ``retry`` says. With ``keep_in`` (a
    :class:`ShardReader`) a remote file is read through that reader's chunk cache instead, one request
    per chunk, and the chunks stay there for the reads that follow (the first epoch after an index
    build); ``version`` is the shard's fingerprint, which names its chunks (default: asked for).

    Raises:
        ShardReadError: the file does not exist or cannot be opened.
        RangesNotSupportedError: the server answers a range request with the whole file.
    """
    path = None
    if _is_hf(url):
        path = _hf_local(url)
    elif not is_remote(url):
        path = local_path(url)
    if path is not None:
        try:
            return open(path, 'rb')
        except FileNotFoundError:
            raise ShardNotFoundError(url, 'not found. Check the path (data_root, the shard list or pattern).'
                                 ) from None
        except OSError as err:
            raise ShardReadError(url, f'{err.strerror}.') from None
    if keep_in is not None:
        return _CachedScanFile(keep_in, url, version or fingerprint(url, keep_in.retry))
    return _RangeFile(url, int(fingerprint(url, retry)['size']), block_bytes, retry)


class _RangeFile(io.RawIOBase):
    """A read-only, seekable file over a remote file of ``size`` bytes, read in ranges of at least
    ``block_bytes`` (:func:`_fetch_range`); the last range read is kept."""

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
            self._start, self._data = self._pos, _fetch_range(self.url, self._pos, stop, self.retry)
            if len(self._data) != stop - self._pos:
                raise _truncated(self.url, self._pos, stop - self._pos, self._pos + len(self._data))
        out = self._data[self._pos - self._start:end - self._start]
        self._pos += len(out)
        return out

    def readinto(self, buffer) -> int:
        data = self.read(len(buffer))
        buffer[:len(data)] = data
        return len(data)


class _CachedScanFile(_RangeFile):
    """A :class:`_RangeFile` whose ranges are the chunks of a :class:`ShardReader` (its cache keeps them)."""

    def __init__(self, reader: 'ShardReader', url: str, version: dict):
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


# Random access ---------------------------------------------------------------------------------------------

def default_cache_dir() -> str:
    """``$VIT_PLUGIN_CACHE/shards`` (default ``~/.cache/vit_plugin/shards``), read now."""
    root = os.environ.get('VIT_PLUGIN_CACHE') or osp.join(osp.expanduser('~'), '.cache', 'vit_plugin')
    return osp.join(root, 'shards')


def _digest(text: str, n: int = 16) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:n]


class _OpenFile(NamedTuple):
    fd: int
    size: int


class _ProcessState:
    """What a :class:`ShardReader` holds in one process: open descriptors, the read-ahead threads, the
    chunks being fetched. Made anew in a forked or spawned child (nothing of it is pickled)."""

    def __init__(self):
        self.pid = os.getpid()
        self.lock = threading.Lock()
        self.files: 'OrderedDict[str, _OpenFile]' = OrderedDict()
        self.pool: Optional[concurrent.futures.ThreadPoolExecutor] = None
        self.inflight: Dict[str, concurrent.futures.Future] = {}
        self.fingerprints: Dict[str, dict] = {}
        self.hf_local: Dict[str, Optional[str]] = {}
        self.last_chunk: Dict[str, int] = {}
        self.account_lock = threading.Lock()  # the file lock on the cache's total excludes other processes only

    def close(self):
        with self.lock:
            files, self.files = list(self.files.values()), OrderedDict()
            pool, self.pool = self.pool, None
        for f in files:
            os.close(f.fd)
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)


class ShardReader:
    """Reads byte ranges of shards, local or remote; one per dataset, shared by its dataloader workers.

    Picklable: it holds only its settings, and each process (a forked or spawned worker) opens its own
    files and threads when it first reads.

    Local files (and hf:// files in the Hugging Face cache) are read with ``os.pread`` on a small LRU of
    open descriptors. A remote file is read in aligned chunks of ``chunk_bytes``, one request each, kept
    as files in ``cache_dir`` (shared by the processes of a node; a chunk appears only once whole) up to
    ``cache_bytes`` in all, the least recently used evicted first. Touching chunk ``k`` of a shard starts
    fetching chunks ``k+1 .. k+readahead_chunks`` in background threads. Within a node a chunk is fetched
    once: the processes that need it at the same time wait for the one fetching it.

    Args:
        cache_dir: the chunk cache's folder; default :func:`default_cache_dir`. Each remote folder gets
            a sub-folder named by a hash of its URL.
        cache_bytes: the bound of the whole cache folder; at least ``chunk_bytes * (readahead_chunks + 2)``.
        chunk_bytes: the size of one request. Large enough that the request latency is small against its
            transfer (16 MiB: ~0.13 s at 1 Gbit/s against ~20 ms of latency), small enough to hold a few.
        readahead_chunks: chunks fetched ahead of the one touched (0: none).
        max_open_files: descriptors kept open per process (shards and chunk files).
        retry_timeout: the longest wait, in seconds, for one request through transient errors (an outage,
            throttling): exponential back-off with jitter from ``backoff_s`` up to ``max_backoff_s`` per
            step (:class:`RetryPolicy`), one log line per step.
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

    # Pickling: the settings only.
    def __getstate__(self):
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

    @property
    def cache_root(self) -> str:
        return self.cache_dir or default_cache_dir()

    def _state(self) -> _ProcessState:
        state = self._state_
        if state is None or state.pid != os.getpid():
            if state is not None:  # a forked child: the descriptors are its own copies; the threads are gone
                for f in state.files.values():
                    os.close(f.fd)
            state = self._state_ = _ProcessState()
        return state

    def close(self) -> None:
        """Closes this process's descriptors and stops its read-ahead threads (a later read opens anew)."""
        state = self._state_
        if state is not None and state.pid == os.getpid():
            state.close()
        self._state_ = None

    # --- reading -----------------------------------------------------------------------------------------
    def read(self, url: str, offset: int, length: int, fingerprint: Optional[dict] = None) -> bytes:
        """Exactly ``length`` bytes of the file at ``url`` from ``offset``.

        Args:
            fingerprint: the shard's :func:`fingerprint` as the caller knows it (e.g. from its index), for a
                remote shard: its size bounds the read-ahead, and it names the cached chunks, so that a
                changed shard never mixes with chunks of its old content. Without it the reader asks for
                it once per shard and process (one request).

        Raises:
            ShardReadError: the file is missing, shorter than ``offset + length`` (truncated), or cannot be
                reached after the retries.
        """
        if offset < 0 or length < 0:
            raise ValueError(f'{url}: offset={offset}, length={length}: both must be >= 0')
        state = self._state()
        path = self._local_file(state, url)
        if path is not None:
            return self._pread(state, url, path, offset, length)
        return self._read_remote(state, url, offset, length, fingerprint)

    def _local_file(self, state: _ProcessState, url: str) -> Optional[str]:
        if not _is_hf(url):
            return None if is_remote(url) else local_path(url)
        if url not in state.hf_local:
            cached = _hf_local(url)
            state.hf_local[url] = osp.realpath(cached) if cached else None
        return state.hf_local[url]

    def _open(self, state: _ProcessState, path: str) -> _OpenFile:
        """An open descriptor of ``path`` from the LRU (opened, and the oldest closed, when not in it)."""
        with state.lock:
            found = state.files.get(path)
            if found is not None:
                state.files.move_to_end(path)
                return found
        fd = os.open(path, os.O_RDONLY)
        opened = _OpenFile(fd, os.fstat(fd).st_size)
        with state.lock:
            if path in state.files:  # another thread opened it meanwhile
                os.close(fd)
                return state.files[path]
            state.files[path] = opened
            while len(state.files) > self.max_open_files:
                os.close(state.files.popitem(last=False)[1].fd)
        return opened

    def _pread(self, state: _ProcessState, url: str, path: str, offset: int, length: int) -> bytes:
        try:
            f = self._open(state, path)
        except FileNotFoundError:
            raise ShardNotFoundError(url, 'not found. Check the path (data_root, the shard list or pattern).'
                                 ) from None
        except OSError as err:
            raise ShardReadError(url, f'{err.strerror}.') from None
        with state.lock:  # the descriptor is not closed by another thread while it is read
            data = os.pread(f.fd, length, offset)
        if len(data) != length:
            raise _truncated(url, offset, length, offset + len(data))
        return data

    # --- remote: chunks ----------------------------------------------------------------------------------
    def _fingerprint(self, state: _ProcessState, url: str, given: Optional[dict]) -> dict:
        if given is not None:
            return given
        if url not in state.fingerprints:
            state.fingerprints[url] = fingerprint(url, self.retry)
        return state.fingerprints[url]

    def chunk_folder(self, url: str, fp: dict) -> str:
        """The cache folder of a remote shard's chunks at the version ``fp`` (its fingerprint)."""
        parent, _, name = url.rstrip('/').rpartition('/')
        version = _digest(json.dumps(fp, sort_keys=True, default=str), 12)
        return osp.join(self.cache_root, _digest(parent), f'{name}.{version}')

    def _read_remote(self, state: _ProcessState, url: str, offset: int, length: int,
                     given: Optional[dict]) -> bytes:
        fp = self._fingerprint(state, url, given)
        size = int(fp['size'])
        if offset + length > size:
            raise _truncated(url, offset, length, size)
        folder = self.chunk_folder(url, fp)
        out = bytearray()
        pos, end = offset, offset + length
        chunk = offset // self.chunk_bytes
        while pos < end:
            chunk = pos // self.chunk_bytes
            start = chunk * self.chunk_bytes
            n = min(end, start + self.chunk_bytes) - pos
            f = self._open_chunk(state, url, folder, chunk, min(self.chunk_bytes, size - start), size)
            with state.lock:
                data = os.pread(f.fd, n, pos - start)
            if len(data) != n:  # the chunk's size was checked when it was opened: only a bug ends here
                raise _truncated(url, offset, length, start + len(data))
            out += data
            pos += n
        if self.readahead_chunks and state.last_chunk.get(url) != chunk:
            state.last_chunk[url] = chunk
            self._read_ahead(state, url, folder, chunk, size)
        return bytes(out)

    def _open_chunk(self, state: _ProcessState, url: str, folder: str, chunk: int, expected: int,
                    size: int) -> _OpenFile:
        """The open chunk file, from the descriptors already open, the cache folder, or fetched."""
        path = self._chunk_path(folder, chunk)
        with state.lock:
            found = state.files.get(path)
            if found is not None:
                state.files.move_to_end(path)
                return found
        for attempt in range(3):
            self._ensure_chunk(state, url, folder, chunk, size)
            try:
                opened = self._open(state, path)
            except FileNotFoundError:  # evicted between its fetch and its open: fetch it again
                continue
            if opened.size == expected:
                return opened
            with state.lock:  # a chunk file of another size is no chunk of this version: replace it
                if state.files.get(path) is opened:
                    os.close(state.files.pop(path).fd)
            _unlink(path)
        raise ShardReadError(url, f'chunk {chunk} vanished from the cache {self.cache_root} as soon as it was '
                                  f'written; raise cache_bytes, or give each job its own cache_dir.')

    def _chunk_path(self, folder: str, chunk: int) -> str:
        return osp.join(folder, f'c{self.chunk_bytes}_{chunk}')

    def _read_ahead(self, state: _ProcessState, url: str, folder: str, chunk: int, size: int) -> None:
        last = (size - 1) // self.chunk_bytes
        for ahead in range(chunk + 1, min(chunk + self.readahead_chunks, last) + 1):
            path = self._chunk_path(folder, ahead)
            with state.lock:
                if path in state.inflight or path in state.files:
                    continue
                if state.pool is None:
                    state.pool = concurrent.futures.ThreadPoolExecutor(
                        max_workers=max(1, self.readahead_chunks), thread_name_prefix='shard-readahead')
                pool = state.pool
            if not osp.exists(path):
                pool.submit(self._ensure_chunk, state, url, folder, ahead, size, True)

    def _ensure_chunk(self, state: _ProcessState, url: str, folder: str, chunk: int, size: int,
                      background: bool = False) -> str:
        """The path of chunk ``chunk``, fetched (once per node) when not in the cache."""
        path = self._chunk_path(folder, chunk)
        if osp.exists(path):
            if not background:
                _touch(path)
            return path
        with state.lock:
            future = state.inflight.get(path)
            owner = future is None
            if owner:
                future = state.inflight[path] = concurrent.futures.Future()
        if not owner:
            try:
                return future.result()
            except Exception:  # noqa: BLE001 (a read-ahead's single try failed: this read tries with its retries)
                if background:
                    return path
                return self._ensure_chunk(state, url, folder, chunk, size)
        try:
            try:
                with _FileLock(path + '.lock'):  # the other processes of the node wait for this one's fetch
                    if not osp.exists(path):
                        start = chunk * self.chunk_bytes
                        data = self._fetch(url, start, min(size, start + self.chunk_bytes), background)
                        _write_atomically(path, data)
                        with state.account_lock:
                            self._account(len(data), keep=path)
            except ShardReadError:
                raise
            except OSError as err:  # the cache folder is full, read-only or gone
                raise _cache_error(url, folder, err) from err
            future.set_result(path)
            return path
        except BaseException as err:
            future.set_exception(err)
            if background:
                return path  # the foreground read fetches it again and reports the error
            raise
        finally:
            with state.lock:
                state.inflight.pop(path, None)

    def _fetch(self, url: str, start: int, end: int, background: bool = False) -> bytes:
        """Bytes ``[start, end)`` of a remote file, one range request, plus the retries of :attr:`retry` (a
        read-ahead's fetch tries once, quietly: the read that needs the chunk waits out an outage)."""
        retry = self.retry._replace(retries=0) if background else self.retry
        data = _fetch_range(url, start, end, retry, quiet=background)
        if len(data) != end - start:
            raise _truncated(url, start, end - start, start + len(data))
        return data

    # --- the cache's bound ---------------------------------------------------------------------------------
    def _account(self, added: int, keep: str) -> None:
        """Adds ``added`` bytes to the node's running total of the cache (a file under an exclusive lock),
        and evicts the least recently used chunks when it passes ``cache_bytes``."""
        root = self.cache_root
        with _FileLock(osp.join(root, _USAGE_FILE)) as fd:
            raw = os.pread(fd, 32, 0)
            try:
                total = int(raw) + added
            except ValueError:  # a new file: count what is there
                total = _cache_usage(root)[0]
            if total > self.cache_bytes:
                total = _evict(root, int(self.cache_bytes * _EVICT_TO), keep)
            os.ftruncate(fd, 0)
            os.pwrite(fd, str(total).encode(), 0)

    def scan_room(self) -> int:
        """The bytes an index build may keep in the cache (what eviction frees down to): the shards that
        fit are scanned through it (:func:`open_for_scan`'s ``keep_in``), the others past it."""
        return int(self.cache_bytes * _EVICT_TO)

    def cache_usage(self) -> int:
        """The bytes of the chunk files in the cache folder now (a full scan)."""
        return _cache_usage(self.cache_root)[0]


def _truncated(url: str, offset: int, length: int, available: int) -> ShardReadError:
    return ShardReadError(url, f'truncated: bytes {offset}-{offset + length} were asked for, the file ends at '
                               f'{available}. Download the shard again: a changed shard is indexed again '
                               f'at the next start (docs/data.md#the-index).')


def _cache_error(url: str, folder: str, err: OSError) -> ShardReadError:
    return ShardReadError(url, f'cannot write the chunk cache in {folder} ({err.strerror or err}). Free '
                               f'space there, or give the reader a cache_dir on a writable local disk.')


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


class _FileLock:
    """An exclusive lock on a file (created when missing), between the processes of a node.

    A POSIX record lock (``lockf``), not ``flock``: a forked child does not inherit it. (A ``flock`` held by
    a read-ahead thread while the process forks a dataloader worker would stay held by the child's copy of
    the descriptor, which no thread of the child ever closes.) Record locks do not exclude the threads of
    one process from each other: the callers do that (one fetch per chunk per process; a thread lock
    around the cache's total).
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
    """(modification time, size, path) of every chunk file under ``root``; removes the temporary files of
    writers that died."""
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
    """Deletes the least recently used chunk files until at most ``target`` bytes remain (never ``keep``,
    the chunk just written); returns the bytes left."""
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


__all__ = ['COMPRESSED_TAR_SUFFIXES', 'DEFAULT_RETRY', 'FolderListing', 'HfPath', 'HubOfflineError',
           'RangesNotSupportedError', 'RetryPolicy', 'ShardNotFoundError', 'ShardReadError', 'ShardReader',
           'ShardUnavailableError',
           'compressed_tars_in_folder', 'default_cache_dir', 'fingerprint', 'fingerprints_in_folder',
           'hf_cached_path', 'hf_cached_snapshot', 'is_compressed_tar', 'is_remote', 'join_url', 'list_folder',
           'list_shards_in_folder', 'local_path', 'open_for_scan', 'read_small_file', 'resolve_hf_url']
