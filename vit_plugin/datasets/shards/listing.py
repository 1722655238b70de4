"""What a folder of shards holds and which version each shard is: listings, fingerprints, small files
(``_info.json``). One listing call per folder where the store lists sizes (docs/data.md#remote-shards)."""
import datetime
import os
import os.path as osp
import posixpath
import urllib.parse
from typing import Any, Dict, List, NamedTuple, Optional, Sequence, Tuple

from vit_plugin.checkpoint.hub import hub_offline

from .errors import HubOfflineError, ShardNotFoundError, ShardReadError, not_found, os_error
from .locations import (hf_cached_path, hf_cached_snapshot, hf_fs, hf_fs_path, hf_local, hf_unavailable,
                        is_compressed_tar, is_hf, is_remote, join_url, local_path, resolve_hf_url)
from .remote import RetryPolicy, fsspec_path, hf_call, hf_fetch, with_retries

# What the fsspec stores put in info() / ls() that changes with a file's content: HTTP headers, s3fs
# (ETag, LastModified, VersionId), gcsfs (generation, md5Hash, crc32c, updated), adlfs (etag,
# last_modified), local-like stores (mtime).
_VERSION_KEYS = ('ETag', 'etag', 'Last-Modified', 'LastModified', 'last_modified', 'VersionId', 'version_id',
                 'generation', 'md5Hash', 'crc32c', 'Content-MD5', 'updated', 'mtime')


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
    """A file in the Hugging Face cache: its blob is named by the sha256 or git blob id the hub lists."""
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
                    fp = _cached_hf_fingerprint(entry.path) if is_hf(url) else _local_fingerprint(entry.stat())
                    entries.append((entry.name, fp))
    except (FileNotFoundError, NotADirectoryError):
        raise not_found(url, 'folder') from None
    except PermissionError:
        raise ShardReadError(url, 'permission denied while listing the folder.') from None
    return entries


def _list_hf(url: str, retry: Optional[RetryPolicy]) -> List[Tuple[str, Optional[dict]]]:
    hf = resolve_hf_url(url)
    fs = hf_fs()

    def ls():
        fs.invalidate_cache()
        return fs.ls(hf_fs_path(hf), detail=True)
    return [(posixpath.basename(item['name']), _hf_fingerprint(item['size'], item.get('lfs'), item.get('blob_id')))
            for item in hf_call(url, hf, ls, retry) if item['type'] == 'file']


def list_folder(url: str, suffixes: Sequence[str] = ('.tar',), retry: Optional[RetryPolicy] = None
                ) -> FolderListing:
    """The shards (files ending with one of ``suffixes``) and the compressed tars directly in a folder.

    Raises:
        ShardReadError: the folder does not exist or cannot be listed.
    """
    suffixes = tuple(s.lower() for s in suffixes)
    entries: List[Tuple[str, Optional[dict]]] = []
    if not is_remote(url):
        entries = _list_local(url, local_path(url))
    elif is_hf(url):  # the hub's listing (complete), else the cached snapshot's (what was downloaded)
        hf = resolve_hf_url(url)
        try:
            if hub_offline():
                raise hf_unavailable(url, hf, 'HF_HUB_OFFLINE is set')
            entries = _list_hf(url, retry)
        except HubOfflineError:
            cached = hf_cached_path(hf)
            if cached is None or not osp.isdir(cached):
                raise
            entries = _list_local(url, cached)
    else:
        fs, path = fsspec_path(url)

        def ls():
            fs.invalidate_cache(path)
            return fs.ls(path, detail=True)
        for item in with_retries(url, ls, retry):
            if item.get('type') != 'directory' and not item['name'].endswith('/'):
                name = urllib.parse.unquote(posixpath.basename(item['name'].rstrip('/')))
                entries.append((name, _remote_fingerprint(item)))
    shards = sorted(name for name, _ in entries if name.lower().endswith(suffixes))
    wanted = set(shards)
    fingerprints = {name: fp for name, fp in entries if fp is not None and name in wanted}
    return FolderListing(shards, sorted(name for name, _ in entries if is_compressed_tar(name)), fingerprints)


def list_shards_in_folder(url: str, suffixes: Sequence[str] = ('.tar',),
                          retry: Optional[RetryPolicy] = None) -> List[str]:
    """The sorted names (relative to ``url``) of the files directly in a folder that end with ``suffixes``."""
    return list_folder(url, suffixes, retry).shards


def compressed_tars_in_folder(url: str, retry: Optional[RetryPolicy] = None) -> List[str]:
    """The sorted names of the compressed tars directly in a folder."""
    return list_folder(url, (), retry).compressed


def fingerprint(url: str, retry: Optional[RetryPolicy] = None) -> dict:
    """What identifies the current content of the file at ``url`` (JSON-serialisable, compare with ``==``).

    Local: ``{'size', 'mtime_ns'}``. Remote: ``{'size'}`` plus what the store gives (ETag, Last-Modified,
    generation...); on the hub (or its cache) ``{'size', 'sha256'}`` or ``{'size', 'blob_id'}``.

    Raises:
        ShardReadError: the file does not exist or cannot be reached.
    """
    if is_hf(url):
        cached = hf_local(url)
        if cached is not None:
            return _cached_hf_fingerprint(cached)
        hf = resolve_hf_url(url)
        fs = hf_fs()
        info = hf_call(url, hf, lambda: fs.info(hf_fs_path(hf), refresh=True), retry)
        if info['type'] != 'file':
            raise ShardReadError(url, 'a folder, not a file.')
        return _hf_fingerprint(info['size'], info.get('lfs'), info.get('blob_id'))
    if not is_remote(url):
        try:
            stat = os.stat(local_path(url))
        except FileNotFoundError:
            raise not_found(url) from None
        except OSError as err:
            raise os_error(url, err) from None
        return _local_fingerprint(stat)
    fs, path = fsspec_path(url)

    def info():
        fs.invalidate_cache(path)
        return fs.info(path)
    found = _remote_fingerprint(with_retries(url, info, retry))
    if found is None:
        raise ShardReadError(url, 'the server gives no size (Content-Length); ranges cannot be read.')
    return found


def fingerprints_in_folder(url: str, suffixes: Sequence[str] = ('.tar',),
                           retry: Optional[RetryPolicy] = None) -> Dict[str, dict]:
    """``{name: fingerprint}`` of the shards directly in a folder: one listing call, plus one request per
    shard the listing does not describe (a plain HTTP index page)."""
    listing = list_folder(url, suffixes, retry)
    out = dict(listing.fingerprints)
    for name in listing.shards:
        if name not in out:
            out[name] = fingerprint(join_url(url, name), retry)
    return out


def read_small_file(url: str, retry: Optional[RetryPolicy] = None) -> Optional[bytes]:
    """The whole content of a small file (e.g. ``_info.json``), None when it does not exist.

    Raises:
        ShardReadError: it exists but cannot be read (offline: its repository is not in the cache).
    """
    if is_hf(url):
        hf = resolve_hf_url(url)
        cached = hf_cached_path(hf)
        if cached is None and hub_offline():
            if hf_cached_snapshot(hf) is None:
                raise hf_unavailable(url, hf, 'HF_HUB_OFFLINE is set')
            return None  # the repository is cached, this file is not part of it
        if cached is None:
            try:
                return hf_call(url, hf, lambda: hf_fetch(hf), retry)
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
            raise os_error(url, err) from None
    fs, fs_path = fsspec_path(url)
    try:
        return with_retries(url, lambda: fs.cat_file(fs_path), retry)
    except ShardNotFoundError:
        return None
