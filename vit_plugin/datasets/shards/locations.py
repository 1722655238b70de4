"""Where a shard is: a local path, an fsspec URL, or ``hf://`` on the Hugging Face hub and in its local
cache. Parsing and cache look-ups only; nothing here reads a shard (docs/data.md#remote-shards)."""
import os
import os.path as osp
import re
import urllib.parse
from typing import NamedTuple, Optional

from vit_plugin.checkpoint.hub import hub_cache_dir, hub_offline

from .errors import HubOfflineError

LOCAL_PROTOCOLS = ('file', 'local')
COMPRESSED_TAR_SUFFIXES = ('.tar.gz', '.tgz', '.tar.bz2', '.tbz2', '.tar.xz', '.txz', '.tar.zst', '.tar.zstd')
HF_REPO_TYPES = {'datasets': 'dataset', 'spaces': 'space'}  # the URL prefix of a repository type; else a model

_SPECIAL_REFS = re.compile(r'^refs/(convert/\w+|pr/\d+)')
_COMMIT = re.compile(r'^[0-9a-f]{40}$')


def protocol(url: str) -> Optional[str]:
    """The protocol of ``url`` (the last of a chain: ``simplecache::s3://`` is ``s3``), None for a path."""
    if '://' not in url:
        return None
    found = url.split('://', 1)[0]
    return found.split('::')[-1] if '::' in found else found


def is_remote(url: str) -> bool:
    """Whether ``url`` is read through fsspec (any protocol but ``file``/``local``), e.g. ``s3://``, ``hf://``."""
    found = protocol(url)
    return found is not None and len(found) > 1 and found not in LOCAL_PROTOCOLS


def is_hf(url: str) -> bool:
    return url.startswith('hf://')


def local_path(url: str) -> str:
    """The file-system path of a local ``url`` (a plain path, or ``file://`` / ``local://``)."""
    for name in LOCAL_PROTOCOLS:
        prefix = name + '://'
        if url.startswith(prefix):
            return url[len(prefix):]
    return url


def join_url(base: str, name: str) -> str:
    """``name`` (relative, ``/``-separated) inside the folder ``base``; an absolute ``name`` as it is."""
    if is_remote(name):
        return name
    if is_remote(base) or protocol(base) in LOCAL_PROTOCOLS:
        return base.rstrip('/') + '/' + name.lstrip('/')
    return osp.join(base, *name.split('/'))


def is_compressed_tar(name: str) -> bool:
    """Whether a file name is a compressed tar (:data:`COMPRESSED_TAR_SUFFIXES`), which has no random access."""
    return name.lower().endswith(COMPRESSED_TAR_SUFFIXES)


# hf:// ------------------------------------------------------------------------------------------------

class HfPath(NamedTuple):
    """Where an ``hf://`` URL points on the Hugging Face hub."""
    repo_type: str  # 'dataset', 'model' or 'space'
    repo_id: str  # '<org>/<name>'
    revision: str  # a branch, tag or commit; 'main' when the URL names none
    path_in_repo: str  # '' for the repository's root


def resolve_hf_url(url: str) -> HfPath:
    """Split ``hf://[datasets/|spaces/]<org>/<name>[@<revision>][/<path>]`` without asking the hub.

    The revision may be URL-quoted (``@refs%2Fpr%2F3``) or a special ref (``@refs/pr/3/<path>``).

    Raises:
        ValueError: not an ``hf://`` URL of an ``<org>/<name>`` repository.
    """
    if not is_hf(url):
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


def hf_cached_snapshot(hf: HfPath) -> Optional[str]:
    """The cached snapshot folder of ``hf``'s repository at its revision, None when not in the local Hugging
    Face cache (``HF_HUB_CACHE`` / ``HF_HOME``, read now)."""
    folder = osp.join(hub_cache_dir(), f'{hf.repo_type}s--' + hf.repo_id.replace('/', '--'))
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


def hf_unavailable(url: str, hf: HfPath, why: str) -> HubOfflineError:
    """The error for an uncached hub file, naming the repository and the download command."""
    flag = f' --repo-type {hf.repo_type}' if hf.repo_type != 'model' else ''
    rev = f' --revision {hf.revision}' if hf.revision != 'main' else ''
    return HubOfflineError(url, f'{why}; {hf.repo_id} is not in the local Hugging Face cache ({hub_cache_dir()}).'
                                f'\nRun `huggingface-cli download {hf.repo_id}{flag}{rev} --local-dir DIR` where '
                                f'the hub is reachable, then point data_root at DIR.')


def hf_local(url: str) -> Optional[str]:
    """The cached copy of an hf:// URL, or None; offline without one, :class:`HubOfflineError`."""
    hf = resolve_hf_url(url)
    cached = hf_cached_path(hf)
    if cached is None and hub_offline():
        raise hf_unavailable(url, hf, 'HF_HUB_OFFLINE is set')
    return cached


def hf_endpoint() -> str:
    """``HF_ENDPOINT`` read now (huggingface_hub reads it once, at import)."""
    from huggingface_hub import constants
    return os.environ.get('HF_ENDPOINT') or constants.ENDPOINT


def hf_fs():
    """A ``HfFileSystem`` on :func:`hf_endpoint`."""
    from huggingface_hub import HfFileSystem
    return HfFileSystem(endpoint=hf_endpoint())


def hf_fs_path(hf: HfPath) -> str:
    """``hf`` as a ``HfFileSystem`` path."""
    prefix = {'dataset': 'datasets/', 'space': 'spaces/'}.get(hf.repo_type, '')
    revision = '' if hf.revision == 'main' else '@' + urllib.parse.quote(hf.revision, safe='')
    return f'{prefix}{hf.repo_id}{revision}' + (f'/{hf.path_in_repo}' if hf.path_in_repo else '')
