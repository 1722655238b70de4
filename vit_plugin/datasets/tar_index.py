"""An index of the images inside tar shards: where each image's bytes lie, and its label.

ImageNet-21k is held today as tar shards (timm's WebDataset shards on the Hugging Face hub) or as a tar
of per-synset tars (image-net.org's ``fall11_whole.tar``, ``ILSVRC2012_img_train.tar``). Reading an
image needs only its byte range in its shard; this module finds those ranges once, by walking the tar
headers (the image data is skipped, not read), and keeps them in one memory-mapped
:mod:`~vit_plugin.datasets.array_file` shared by every data-loader worker, as the list-file index does.

* **Layouts.** ``'webdataset'``: each sample is a run of members sharing a key (the member name up to
  the first dot of its file name, as the ``webdataset`` library groups them), e.g.
  ``n01440764_10026.jpg`` + ``.cls`` + ``.json``; the image member is ``jpg``, ``jpeg``, ``png`` or
  ``webp``. ``'tar_of_tars'``: each member of the outer tar is a tar named after its synset
  (``n01440764.tar``) holding that synset's images.
* **Labels** (:class:`LabelRule`): the text of the ``cls`` member, a field of the ``json`` member, or the
  synset (the key's ``nXXXXXXXX`` prefix, or the inner tar's name) looked up in a list of synsets: a
  label space of :mod:`vit_plugin.label_spaces`, or the sorted synsets of the data themselves (winter21,
  whose list ships nowhere).
* **Shards** (:func:`resolve_shards`): a brace pattern (``imagenet22k-train-{0000..4095}.tar``), a list,
  or every ``.tar`` of the folder; a ``_info.json`` / ``info.json`` split file (timm's format) gives the
  shard list of a split and each shard's sample count, which the index checks.
* **Index file.** Built with every core (one process per shard, or per inner tar), a shard's rows
  written to temporary files as it is done (bounded memory), progress logged; moved into place whole
  (a half-written index is never used). It records each shard's fingerprint (size and modification
  time, or what the remote store gives) and is rebuilt when one changes; the log says which and how.
* **At scale.** Each scanned shard's rows are also kept in ``<index>.parts`` until the index is
  written, so a stopped build goes on from them. One process builds (it holds ``<index>.lock``); the
  others poll for the file, for up to ``wait_s``. A remote scan can go through a
  :class:`~vit_plugin.datasets.shard_files.ShardReader`'s chunk cache (``keep_in``), which then serves the
  first reads. Rows that repeat a sample key are counted in the header: a warning, or an error.
* **Bad input** stops the build with a :class:`TarIndexError` naming the shard, the key and the value: a
  missing, compressed, truncated or unreadable shard, a sample without an image or a label, a label
  that is not a number or lies outside ``[0, num_classes)``, a synset missing from the label space, a
  shard whose sample count differs from the split file's. Every shard is scanned first: one error
  lists each bad shard (up to :data:`MAX_LISTED`, with a count of the rest). A store that cannot be
  reached, or ignores byte ranges, stops the build at once.

docs/data.md tells how to get each format and which config reads it.
"""
import errno
import hashlib
import json
import logging
import multiprocessing
import os
import os.path as osp
import re
import shlex
import shutil
import tarfile
import time
from typing import Dict, Iterator, List, NamedTuple, Optional, Sequence, Tuple, Union

import numpy as np
from mmengine.logging import print_log

from vit_plugin import runtime
from vit_plugin.datasets.array_file import SpooledArray, read_array_file, read_array_header, write_array_file
from vit_plugin.datasets.shards import (HubOfflineError, RangesNotSupportedError, RetryPolicy, ShardReader,
                                        ShardReadError, ShardUnavailableError, compressed_tars_in_folder,
                                        fingerprint, fingerprints_in_folder, is_compressed_tar, is_remote,
                                        join_url, list_shards_in_folder, local_path, open_for_scan,
                                        read_small_file)

LAYOUTS = ('webdataset', 'tar_of_tars')
LABEL_SOURCES = ('cls', 'json', 'synset')
IMAGE_EXTENSIONS = ('jpg', 'jpeg', 'png', 'webp')
INFO_FILES = ('_info.json', 'info.json')
INDEX_KIND = 'vit_plugin.tar_shards'
FORMAT_VERSION = 1

_BLOCK = 512
_SYNSET = re.compile(r'n\d{8}')
#: (magic bytes, compression, the tool whose ``-dc`` writes the decompressed bytes to stdout)
_COMPRESSION_MAGIC = ((b'\x1f\x8b', 'gzip', 'gzip'), (b'BZh', 'bzip2', 'bzip2'),
                      (b'\xfd7zXZ\x00', 'xz', 'xz'), (b'\x28\xb5\x2f\xfd', 'zstd', 'zstd'))
_SUFFIX_COMPRESSION = {'.tar.gz': 'gzip', '.tgz': 'gzip', '.tar.bz2': 'bzip2', '.tbz2': 'bzip2', '.tar.xz': 'xz',
                       '.txz': 'xz', '.tar.zst': 'zstd', '.tar.zstd': 'zstd'}
#: The most bad shards one error lists; it counts the rest.
MAX_LISTED = 20
_PROGRESS_S = 10.0
_WAIT_LOG_S = 60.0  # a waiting process's progress line
_POLL_S = 1.0  # how often a waiting process looks for the finished index
DUPLICATE_KEYS = ('warn', 'error')


class TarIndexError(ValueError):
    """Tar shards that cannot be indexed as asked; the message names the shard, the key and the value."""


class LabelRule(NamedTuple):
    """Where a sample's label comes from.

    Attributes:
        source (str): ``'cls'`` (the integer text of the ``cls`` member), ``'json'`` (the integer field
            ``json_key`` of the ``json`` member; dots name nested fields) or ``'synset'``.
        json_key (str): The field for ``'json'``.
        synsets (tuple[str] | None): For ``'synset'``: the class order (a label space's synsets); None
            numbers the sorted synsets found in the data.
    """
    source: str = 'cls'
    json_key: str = 'label'
    synsets: Optional[Tuple[str, ...]] = None

    def describe(self) -> dict:
        """What identifies the rule in an index header (the synset list by its hash)."""
        listed = None if self.synsets is None else hashlib.sha1('\n'.join(self.synsets).encode()).hexdigest()
        return {'source': self.source, 'json_key': self.json_key if self.source == 'json' else None,
                'synsets': listed}


class ShardList(NamedTuple):
    """The shards of a split: the folder (local path or URL), their names in it, and the sample count of
    each when a split file gives them."""
    base: str
    names: Tuple[str, ...]
    counts: Optional[Tuple[int, ...]] = None
    info_file: Optional[str] = None

    def url(self, i: int) -> str:
        return join_url(self.base, self.names[i])


# ----------------------------------------------------------------------------------------- shard lists
def expand_braces(pattern: str) -> List[str]:
    """Expand shell-style braces: ``{0000..0003}`` (numbers, zero-padded like the first bound) and
    ``{a,b}``; several groups multiply, left to right. Text without braces is returned as is."""
    match = re.search(r'\{([^{}]*)\}', pattern)
    if match is None:
        return [pattern]
    head, body, tail = pattern[:match.start()], match.group(1), pattern[match.end():]
    numeric = re.fullmatch(r'(-?\d+)\.\.(-?\d+)', body)
    if numeric:
        first, last = numeric.group(1), numeric.group(2)
        width = len(first) if first.startswith('0') or len(first) == len(last) else 0
        step = 1 if int(last) >= int(first) else -1
        items = [str(i).zfill(width) for i in range(int(first), int(last) + step, step)]
    elif ',' in body:
        items = body.split(',')
    else:
        raise TarIndexError(f'{pattern!r}: cannot expand {{{body}}}; use {{0000..0099}} (numbers) or '
                            f'{{a,b,c}} (a list)')
    return [head + item + rest for item in items for rest in expand_braces(tail)]


def _load_split_info(data_root: str, retry: Optional[RetryPolicy] = None
                     ) -> Tuple[Optional[dict], Optional[str]]:
    for name in INFO_FILES:
        url = join_url(data_root, name)
        raw = read_small_file(url, retry)
        if raw is None:
            continue
        try:
            info = json.loads(raw)
        except ValueError as err:
            raise TarIndexError(f'{url}: not valid JSON ({err}); fix or remove the file') from None
        return info, url
    return None, None


def resolve_shards(data_root: str, shards: Union[None, str, Sequence[str]] = None,
                   split: Optional[str] = None, retry: Optional[RetryPolicy] = None) -> ShardList:
    """The shards a dataset reads.

    Args:
        data_root (str): The folder of the shards: a local path or an fsspec URL.
        shards (str | list[str], optional): A brace pattern or a list of names (relative to
            ``data_root``, or absolute). None: the split's shards of the split file when ``data_root`` has
            one (``_info.json`` / ``info.json``), else every ``.tar`` of the folder whose name holds
            ``-<split>-`` or, without ``split``, every ``.tar`` of the folder.
        split (str, optional): The split's name in the split file (``train``, ``validation``).
        retry (RetryPolicy, optional): How remote reads wait out an outage; default 600 s in all.

    Returns:
        ShardList: The folder, the names and, from a split file, the sample count of each shard.

    Raises:
        TarIndexError: No shard matches, a shard is compressed, or the split file lacks the split.
    """
    info, info_url = _load_split_info(data_root, retry)
    counts_by_name: Dict[str, int] = {}
    if info is not None and split is not None:
        splits = info.get('splits', {})
        entry = splits.get(split)
        if entry is not None and len(entry.get('filenames', ())) == len(entry.get('shard_lengths', ())):
            counts_by_name = dict(zip(entry['filenames'], (int(c) for c in entry['shard_lengths'])))
        elif shards is None:
            raise TarIndexError(f"{info_url}: no split {split!r} with 'filenames' and 'shard_lengths' (it has "
                                f'{sorted(splits)}); set split, or name the shards in the config')
    if isinstance(shards, str):
        names = expand_braces(shards)
    elif shards is not None:
        names = [name for item in shards for name in expand_braces(str(item))]
    elif counts_by_name:
        names = list(counts_by_name)
    else:
        found = list_shards_in_folder(data_root, retry=retry)
        token = f'-{split}-' if split else ''
        names = [n for n in found if token in osp.basename(n)] if token else found
        if not names:
            packed = compressed_tars_in_folder(data_root, retry)
            hint = (f'; it holds compressed tars ({", ".join(packed[:3])}): decompress them first, e.g. '
                    f'`{_decompress_command(join_url(data_root, packed[0]))}`' if packed else '')
            raise TarIndexError(f'{data_root}: no .tar shard' + (f' with {token!r} in its name' if token else '')
                                + f'{hint}. Set shards= (a brace pattern or a list) or data_root.')
    if not names:
        raise TarIndexError(f'{data_root}: the shard list is empty; set shards= to a brace pattern or a list')
    for name in names:
        if is_compressed_tar(name):
            raise TarIndexError(_compressed_message(join_url(data_root, name)))
    counts = None
    if counts_by_name and all(osp.basename(n) in counts_by_name or n in counts_by_name for n in names):
        counts = tuple(counts_by_name.get(n, counts_by_name.get(osp.basename(n))) for n in names)
    return ShardList(data_root, tuple(names), counts, info_url if counts else None)


def _decompressed_name(name: str) -> str:
    """``x.tar.gz`` / ``x.tgz`` -> ``x.tar``."""
    suffix = next(s for s in _SUFFIX_COMPRESSION if name.lower().endswith(s))
    return name[:-len(suffix)] + '.tar'


def _decompress_command(url: str) -> str:
    """The shell command that writes the ``.tar`` of the compressed tar at ``url`` beside it (of a local
    copy, named by its file name, for a remote one)."""
    path = local_path(url) if not is_remote(url) else url.rstrip('/').rpartition('/')[2]
    kind = next(k for s, k in _SUFFIX_COMPRESSION.items() if path.lower().endswith(s))
    return f'{kind} -dc {shlex.quote(path)} > {shlex.quote(_decompressed_name(path))}'


def _compressed_message(url: str) -> str:
    """For a shard named as a compressed tar (``.tar.gz``, ``.tgz``...)."""
    where = '' if not is_remote(url) else ' (on a local copy, then upload the .tar)'
    return (f'{url} is a compressed tar, which allows no random access: decompress it first{where}, e.g. '
            f'`{_decompress_command(url)}`, and name the .tar in the config (shards=).')


def _compressed_content_message(url: str, kind: str, tool: str) -> str:
    """For a shard named ``.tar`` whose bytes are compressed."""
    remote = is_remote(url)
    path = url.rstrip('/').rpartition('/')[2] if remote else local_path(url)
    raw = shlex.quote(path + '.raw')
    command = f'{tool} -dc {shlex.quote(path)} > {raw} && mv {raw} {shlex.quote(path)}'
    where = 'on a local copy, then upload it' if remote else 'in place'
    return (f'{url} holds {kind}-compressed data under a .tar name, which allows no random access: '
            f'decompress it first, {where}: `{command}`.')


# ------------------------------------------------------------------------------------------ the scans
class _Window:
    """A read-only, seekable view of ``[start, start + size)`` of a file object: an inner tar."""

    def __init__(self, f, start: int, size: int):
        self._f, self._start, self._size, self._pos = f, start, size, 0

    def seek(self, pos: int, whence: int = 0) -> int:
        self._pos = pos if whence == 0 else self._pos + pos if whence == 1 else self._size + pos
        return self._pos

    def tell(self) -> int:
        return self._pos

    def read(self, n: int = -1) -> bytes:
        n = self._size - self._pos if n is None or n < 0 else min(n, self._size - self._pos)
        if n <= 0:
            return b''
        self._f.seek(self._start + self._pos)
        data = self._f.read(n)
        self._pos += len(data)
        return data


def _split_key(name: str) -> Tuple[str, str]:
    """``'dir/n01_1.a.jpg'`` -> ``('dir/n01_1', 'a.jpg')``: the key ends at the first dot of the file name."""
    folder, _, base = name.rpartition('/')
    stem, dot, ext = base.partition('.')
    return (folder + '/' if folder else '') + stem, ext if dot else ''


def _synset_of(key: str) -> Optional[str]:
    match = _SYNSET.match(key.rpartition('/')[2])
    return match.group(0) if match else None


def _walk(tf: tarfile.TarFile, url: str, size: int, base: int = 0) -> Iterator[tarfile.TarInfo]:
    """The regular members of ``tf`` whose data lies inside the file; a truncated archive raises."""
    try:
        for member in tf:
            if member.isfile():
                if base + member.offset_data + member.size > size:
                    raise TarIndexError(f'{url}: truncated: member {member.name!r} ends at byte '
                                        f'{base + member.offset_data + member.size:,}, the file has {size:,}. '
                                        f'Download the shard again.')
                yield member
    except tarfile.ReadError as err:
        raise TarIndexError(f'{url}: not a readable tar at byte {base + tf.offset:,} ({err}); the shard is '
                            f'damaged or truncated: download it again.') from None
    # An archive ends with zero blocks; a file cut exactly between two members has none.
    tf.fileobj.seek(tf.offset)
    end = tf.fileobj.read(_BLOCK)
    if len(end) < _BLOCK or end.count(0) != _BLOCK:
        raise TarIndexError(f'{url}: truncated: no end-of-archive block after byte {base + tf.offset:,}. '
                            f'Download the shard again.')


def _check_magic(f, url: str, inner: bool = False) -> None:
    head = f.read(_BLOCK)
    f.seek(0)
    for magic, kind, tool in _COMPRESSION_MAGIC:
        if head.startswith(magic):
            if inner:
                raise TarIndexError(f'{url}: a {kind}-compressed inner tar; decompress the inner tars and write '
                                    f'the outer tar again')
            raise TarIndexError(_compressed_content_message(url, kind, tool))
    if len(head) < _BLOCK:
        raise TarIndexError(f'{url}: {len(head)} bytes, not a tar archive (a tar has at least one 512-byte '
                            f'block); download the shard again.')


def _parse_label(text: bytes, url: str, key: str, what: str) -> int:
    try:
        return int(text.strip())
    except ValueError:
        value = text[:40].decode('utf-8', 'replace')
        raise TarIndexError(f'{url}, sample {key!r}: the {what} {value!r} is not an integer label') from None


def _json_label(raw: bytes, url: str, key: str, json_key: str) -> int:
    try:
        value = json.loads(raw)
        for part in json_key.split('.'):
            value = value[part]
    except (ValueError, KeyError, TypeError, IndexError):
        raise TarIndexError(f'{url}, sample {key!r}: its json has no integer field {json_key!r}; set '
                            f"label=dict(source='json', key=...) to the field holding the label") from None
    if isinstance(value, bool) or not isinstance(value, int):
        raise TarIndexError(f'{url}, sample {key!r}: json field {json_key!r} is {value!r}, not an integer label')
    return value


class _Scan:
    """The samples of one shard (or inner tar), in order: image member names, byte ranges, labels or
    synsets."""

    def __init__(self):
        self.names: List[bytes] = []
        self.offsets: List[int] = []
        self.sizes: List[int] = []
        self.labels: List[int] = []
        self.synsets: List[str] = []


def _scan_webdataset(url: str, rule: LabelRule, retry: Optional[RetryPolicy] = None, keep: Optional[tuple] = None
                     ) -> _Scan:
    scan = _Scan()
    with _open_for_scan(url, retry, keep) as f:
        size = f.seek(0, 2)
        f.seek(0)
        _check_magic(f, url)
        tf = tarfile.open(fileobj=f, mode='r:')
        seen = set()
        key, group = None, {}

        def finish():
            if key is None:
                return
            image = next((group[e] for e in IMAGE_EXTENSIONS if e in group), None)
            if image is None:
                raise TarIndexError(f'{url}, sample {key!r}: no image member (expected one of '
                                    f'{", ".join(IMAGE_EXTENSIONS)}; it has {", ".join(sorted(group)) or "none"})')
            if rule.source == 'synset':
                synset = _synset_of(key)
                if synset is None:
                    raise TarIndexError(f"{url}, sample {key!r}: the key does not start with a synset "
                                        f"(nXXXXXXXX); use label=dict(source='cls') or 'json'")
                scan.synsets.append(synset)
            else:
                member = group.get(rule.source)
                if member is None:
                    raise TarIndexError(f'{url}, sample {key!r}: no {rule.source!r} member for its label (it has '
                                        f'{", ".join(sorted(group))}); set label=dict(source=...)')
                raw = tf.extractfile(member).read()
                scan.labels.append(_parse_label(raw, url, key, 'cls') if rule.source == 'cls'
                                   else _json_label(raw, url, key, rule.json_key))
            scan.names.append(image.name.encode('utf-8'))
            scan.offsets.append(image.offset_data)
            scan.sizes.append(image.size)

        for member in _walk(tf, url, size):
            member_key, ext = _split_key(member.name)
            if member_key != key:
                finish()
                if member_key in seen:
                    raise TarIndexError(f'{url}: key {member_key!r} appears twice, apart; a sample\'s members '
                                        f'must follow each other (write the shard again)')
                seen.add(member_key)
                key, group = member_key, {}
            group[ext.lower()] = member
        finish()
    return scan


def _scan_inner_tar(url: str, start: int, size: int, inner: str, retry: Optional[RetryPolicy] = None,
                    keep: Optional[tuple] = None) -> _Scan:
    scan = _Scan()
    synset = osp.splitext(osp.basename(inner))[0]
    with _open_for_scan(url, retry, keep) as f:
        window = _Window(f, start, size)
        where = f'{url}/{inner}'
        _check_magic(window, where, inner=True)
        tf = tarfile.open(fileobj=window, mode='r:')
        for member in _walk(tf, where, size):
            ext = member.name.rpartition('.')[2].lower()
            if ext not in IMAGE_EXTENSIONS:
                raise TarIndexError(f'{where}, member {member.name!r}: not an image (expected '
                                    f'{", ".join(IMAGE_EXTENSIONS)}); remove it from the archive')
            scan.names.append(f'{inner}/{member.name}'.encode('utf-8'))
            scan.offsets.append(start + member.offset_data)
            scan.sizes.append(member.size)
            scan.synsets.append(synset)
    return scan


def _open_for_scan(url: str, retry: Optional[RetryPolicy], keep: Optional[tuple]):
    """The shard, read through a reader's chunk cache when ``keep`` is ``(reader, fingerprint)``."""
    if keep is None:
        return open_for_scan(url, retry=retry)
    return open_for_scan(url, retry=retry, keep_in=keep[0], version=keep[1])


def _inner_tars(url: str, retry: Optional[RetryPolicy] = None, keep: Optional[tuple] = None
                ) -> List[Tuple[str, int, int]]:
    """``(name, data offset, size)`` of every member of an outer tar; each must be a ``<synset>.tar``."""
    inner = []
    with _open_for_scan(url, retry, keep) as f:
        size = f.seek(0, 2)
        f.seek(0)
        _check_magic(f, url)
        tf = tarfile.open(fileobj=f, mode='r:')
        for member in _walk(tf, url, size):
            name = member.name
            if is_compressed_tar(name):
                raise TarIndexError(f'{url}, member {name!r}: a compressed inner tar; decompress the inner tars '
                                    f'and write the outer tar again')
            if not name.endswith('.tar') or not _SYNSET.fullmatch(osp.basename(name)[:-4]):
                raise TarIndexError(f"{url}, member {name!r}: expected inner tars named <synset>.tar (a tar of "
                                    f"tars); for shards of samples use layout='webdataset'")
            inner.append((name, member.offset_data, member.size))
    if not inner:
        raise TarIndexError(f'{url}: an empty tar of tars; download it again')
    return inner


def _run_task(task: tuple) -> Tuple[int, Union[_Scan, TarIndexError]]:
    """One unit of the build, in a worker process: ``(position, scan)``, or ``(position, error)`` for a bad
    shard (the build goes on and reports them all).

    Raises:
        TarIndexError: the store cannot be reached (past the retry policy) or ignores byte ranges: every
            other shard would fail the same way.
    """
    position, _, kind, url, args = task[:5]
    retry = task[5] if len(task) > 5 else None
    keep = task[6] if len(task) > 6 else None
    try:
        try:
            if kind == 'shard':
                return position, _scan_webdataset(url, args, retry, keep)
            return position, _scan_inner_tar(url, *args, retry, keep)
        finally:
            if keep is not None:
                keep[0].close()  # this process's read-ahead threads finish their chunks
    except TarIndexError as err:
        return position, err
    except _STORE_ERRORS as err:
        raise TarIndexError(f'{err}') from None
    except ShardReadError as err:
        return position, TarIndexError(f'{url}: cannot be read ({err.reason or err}); check the path and the '
                                       f'permissions, or download the shard again')
    except OSError as err:
        return position, TarIndexError(f'{url}: cannot be read ({err}); check the path and the permissions')


#: Errors of the store, not of one shard: the build stops at the first.
_STORE_ERRORS = (ShardUnavailableError, HubOfflineError, RangesNotSupportedError)


def _all_problems(problems: List[str], base: str) -> TarIndexError:
    """One error for every bad shard found (the first :data:`MAX_LISTED`, and a count of the rest)."""
    if len(problems) == 1:
        return TarIndexError(problems[0])
    rest = len(problems) - MAX_LISTED
    listing = '\n'.join(f'- {p}' for p in problems[:MAX_LISTED])
    more = f'\n- and {rest:,} more' if rest > 0 else ''
    return TarIndexError(f'{base}: {len(problems):,} bad shards (every shard was scanned); fix or replace each, '
                         f'then start again:\n{listing}{more}')


# ------------------------------------------------------------------------------------------- the index
def default_index_dir() -> str:
    """Where indexes of remote or read-only shards go: ``$VIT_PLUGIN_CACHE/shard_index`` (default
    ``~/.cache/vit_plugin/shard_index``)."""
    root = os.environ.get('VIT_PLUGIN_CACHE') or osp.join(osp.expanduser('~'), '.cache', 'vit_plugin')
    return osp.join(root, 'shard_index')


def default_index_path(shards: ShardList, layout: str, rule: LabelRule, split: Optional[str]) -> str:
    """The index file of these shards: a hidden folder beside local, writable shards, else
    :func:`default_index_dir`; the name holds a hash of the shards and the settings."""
    digest = hashlib.sha1(json.dumps([shards.base, list(shards.names), layout, rule.describe()]).encode()
                          ).hexdigest()[:16]
    name = f'{split or "shards"}-{digest}.index'
    if not is_remote(shards.base):
        folder = osp.join(local_path(shards.base), '.vit_plugin_index')
        try:
            os.makedirs(folder, exist_ok=True)
            if os.access(folder, os.W_OK):
                return osp.join(folder, name)
        except OSError:
            pass
    return osp.join(default_index_dir(), name)


def shard_fingerprints(shards: ShardList, retry: Optional[RetryPolicy] = None) -> List[dict]:
    """The current fingerprint of every shard (one listing per remote folder); missing shards raise one
    :class:`TarIndexError` naming each."""
    listed: Dict[str, Dict[str, dict]] = {}
    result, problems = [], []
    for i, name in enumerate(shards.names):
        url = shards.url(i)
        try:
            if is_remote(url):
                folder, _, base = url.rpartition('/')
                if folder not in listed:
                    listed[folder] = fingerprints_in_folder(folder, retry=retry)
                found = listed[folder].get(base)
                if found is None:
                    raise ShardReadError(url, 'no such file')
                result.append(found)
            else:
                result.append(fingerprint(url, retry))
        except _STORE_ERRORS:
            raise
        except ShardReadError as err:
            problems.append(f'{url}: missing or unreadable ({err.reason or err}); check data_root and the '
                            f'shard names, or download the shard')
    if problems:
        raise _all_problems(problems, shards.base)
    return result


class TarShardIndex:
    """The samples of a set of tar shards, in memory-mapped arrays (use :meth:`open`).

    Row ``i`` is one sample: its image's byte range (``offsets[i]``, ``sizes[i]``) in shard
    ``shard_of(i)``, its label ``labels[i]`` and its image member's name. Rows follow the shards' order and,
    within a shard, the order of the tar. Read-only: copies share it, and pickling sends the file name.
    """

    def __init__(self, path: str, header: dict, arrays: Dict[str, np.ndarray]):
        self.path, self.header = path, header
        self.names_data, self.name_offsets = arrays['names'], arrays['name_offsets']
        self.offsets, self.sizes, self.labels = arrays['offsets'], arrays['sizes'], arrays['labels']
        self.shard_starts = arrays['shard_starts']
        self.base: str = header['base']
        self.shard_names: Tuple[str, ...] = tuple(header['shards'])
        self.fingerprints: Tuple[dict, ...] = tuple(header['fingerprints'])
        self.synsets: Optional[Tuple[str, ...]] = (tuple(header['synsets']) if header.get('synsets') is not None
                                                   else None)

    # ------------------------------------------------------------------------------------ building
    @classmethod
    def open(cls, shards: ShardList, layout: str = 'webdataset', rule: LabelRule = LabelRule(),
             num_classes: Optional[int] = None, index_path: Optional[str] = None, split: Optional[str] = None,
             workers: Optional[int] = None, rebuild: bool = False,
             retry: Optional[RetryPolicy] = None, keep_in: Optional[ShardReader] = None,
             wait_s: Optional[float] = None, duplicate_keys: str = 'warn') -> 'TarShardIndex':
        """Open the index of ``shards``, building it when it is missing or a shard changed (the log says
        why). One process builds (a lock file beside the index); the others wait for it (``wait_s``).

        Args:
            shards (ShardList): From :func:`resolve_shards`.
            layout (str): ``'webdataset'`` or ``'tar_of_tars'``.
            rule (LabelRule): Where labels come from.
            num_classes (int, optional): Every label must lie in ``[0, num_classes)`` (checked on every
                open). Defaults to None: not checked.
            index_path (str, optional): The index file; default :func:`default_index_path`.
            split (str, optional): Names the default index file.
            workers (int, optional): Processes that scan shards; default every core.
            rebuild (bool): Build even when the index is current.
            retry (RetryPolicy, optional): How remote reads wait out an outage; default 600 s in all.
            keep_in (ShardReader, optional): Scan remote shards through this reader's chunk cache, as
                many as fit its bound, so that their first reads fetch nothing again.
            wait_s (float, optional): The longest wait for another process's build; None: no limit.
            duplicate_keys (str): Samples of one key in several rows: ``'warn'`` (a count and the first
                examples) or ``'error'``.

        Raises:
            TarIndexError: Bad input (see the module docstring); nothing is written then. Or the wait
                for another process's build passed ``wait_s``.
        """
        if duplicate_keys not in DUPLICATE_KEYS:
            raise TarIndexError(f'duplicate_keys={duplicate_keys!r}: use one of {DUPLICATE_KEYS}')
        if layout not in LAYOUTS:
            raise TarIndexError(f'layout={layout!r}: use one of {LAYOUTS}')
        if rule.source not in LABEL_SOURCES:
            raise TarIndexError(f'label source {rule.source!r}: use one of {LABEL_SOURCES}')
        if layout == 'tar_of_tars' and rule.source != 'synset':
            raise TarIndexError("layout='tar_of_tars' takes its labels from the inner tars' synsets: "
                                "set label=dict(source='synset')")
        path = index_path or default_index_path(shards, layout, rule, split)
        expect = {'kind': INDEX_KIND, 'version': FORMAT_VERSION, 'layout': layout, 'label': rule.describe(),
                  'base': shards.base, 'shards': list(shards.names),
                  'fingerprints': shard_fingerprints(shards, retry)}
        found = None if rebuild else read_array_file(path, expect)
        if found is None:
            found = _build_or_wait(path, shards, layout, rule, expect, workers, retry, keep_in, wait_s, rebuild)
        index = cls(path, *found)
        if num_classes is not None:
            index.check_labels(num_classes)
        index.check_duplicates(duplicate_keys)
        return index

    # ------------------------------------------------------------------------------------- reading
    def __len__(self) -> int:
        return len(self.labels)

    def shard_of(self, row: int) -> int:
        """The position in :attr:`shard_names` of the shard holding ``row``."""
        return int(np.searchsorted(self.shard_starts, row, side='right')) - 1

    def shard_url(self, shard: int) -> str:
        return join_url(self.base, self.shard_names[shard])

    def member(self, row: int) -> str:
        """The image member's name (``<inner>.tar/<name>`` in a tar of tars)."""
        return self.names_data[self.name_offsets[row]:self.name_offsets[row + 1]].tobytes().decode('utf-8')

    def key(self, row: int) -> str:
        """The sample's key: the image member's name without folders and extensions."""
        return _split_key(self.member(row).rpartition('/')[2])[0]

    def location(self, row: int) -> str:
        """``<shard url>:<member>``, how messages name a sample."""
        return f'{self.shard_url(self.shard_of(row))}:{self.member(row)}'

    def check_labels(self, num_classes: int) -> None:
        """Raise :class:`TarIndexError` naming the first sample whose label is outside ``[0, num_classes)``."""
        if not len(self.labels):
            return
        low, top = int(self.labels.min()), int(self.labels.max())
        if low >= 0 and top < num_classes:
            return
        row = int(np.argmax((self.labels < 0) | (self.labels >= num_classes)))
        raise TarIndexError(f'{self.location(row)}: label {int(self.labels[row])} is outside [0, {num_classes}) '
                            f'(the largest is {top}). Set num_classes (dataset, data preprocessor, head) to '
                            f'the classes of these shards, or check the label source.')

    def check_duplicates(self, policy: str = 'warn') -> None:
        """Warn (``'warn'``), or raise :class:`TarIndexError` (``'error'``), when rows share a sample key
        (:meth:`key`): a shard that is a copy of another, say. Each such row is then read once per epoch,
        so the image is read twice."""
        found = self.header.get('duplicate_keys') or {}
        count = int(found.get('count') or 0)
        if not count:
            return
        examples = [f'{self.key(b)!r} in {self.shard_names[self.shard_of(a)]} and '
                    f'{self.shard_names[self.shard_of(b)]}' for a, b in found.get('rows', [])[:3]]
        if policy == 'error':
            raise TarIndexError(f'{count:,} samples repeat the key of an earlier one (duplicate_keys=\'error\'), '
                                f'e.g.\n{examples[0]}.\nRemove the copies (a shard written twice?), or set '
                                f'duplicate_keys=\'warn\'.')
        print_log(f'{self.base}: {count:,} samples repeat the key of an earlier one, e.g. {"; ".join(examples)}. '
                  f'Each is read once per epoch, so its image twice. Remove the copies (a shard written twice?), '
                  f'or refuse them: duplicate_keys=\'error\'.', logger='current', level=logging.WARNING)

    def __getstate__(self):
        return {'path': self.path, 'expect': {k: self.header[k] for k in
                                               ('kind', 'version', 'layout', 'label', 'base', 'shards',
                                                'fingerprints')}}

    def __setstate__(self, state):
        found = read_array_file(state['path'], state['expect'])
        if found is None:
            raise TarIndexError(f"{state['path']}: the shard index changed or vanished after the dataset was "
                                f'built (a shard replaced during the run?); restart the run')
        self.__init__(state['path'], *found)

    def __deepcopy__(self, memo):
        return self  # read-only: sharing is a copy


def _tasks(shards: ShardList, layout: str, rule: LabelRule, retry: Optional[RetryPolicy] = None,
           keeps: Optional[List[Optional[tuple]]] = None) -> Tuple[List[tuple], List[str]]:
    """The units of the build, in row order: ``(position, shard, kind, url, args, retry, keep)``; and the
    problems of the outer tars that could not be listed. ``keeps[i]``: ``(reader, fingerprint)`` to scan
    shard ``i`` through the reader's chunk cache, or None."""
    keeps = keeps or [None] * len(shards.names)
    if layout == 'webdataset':
        return [(i, i, 'shard', shards.url(i), rule, retry, keeps[i]) for i in range(len(shards.names))], []
    tasks, problems = [], []
    for i in range(len(shards.names)):
        try:
            try:
                inner = _inner_tars(shards.url(i), retry, keeps[i])
            finally:
                if keeps[i] is not None:
                    keeps[i][0].close()  # no read-ahead thread runs when the workers fork
        except TarIndexError as err:
            problems.append(str(err))
            continue
        except _STORE_ERRORS as err:
            raise TarIndexError(f'{err}') from None
        except ShardReadError as err:
            problems.append(f'{shards.url(i)}: cannot be read ({err.reason or err}); download it again')
            continue
        for name, start, size in inner:
            tasks.append((len(tasks), i, 'inner', shards.url(i), (start, size, name), retry, keeps[i]))
    return tasks, problems


def _scans(tasks: List[tuple], workers: int) -> Iterator[Tuple[int, _Scan]]:
    """The scans in task order, from ``workers`` processes (forked: the tasks need nothing from the
    training process, and forking costs no import)."""
    if workers <= 1 or len(tasks) <= 1:
        yield from map(_run_task, tasks)
        return
    context = multiprocessing.get_context('fork')
    # Objects the collector never visits are never written to, so the workers share the parent's heap
    # pages instead of copying them (measured: 169 -> 11 MiB of private memory per worker).
    # The workers end under SIGTERM whatever handler the training process installed (pre-emption).
    with runtime.frozen_heap():
        pool = context.Pool(workers, initializer=runtime.default_stop_signals)
        try:
            yield from pool.imap(_run_task, tasks, chunksize=1)
        except BaseException:  # an error, Ctrl-C, or the consumer stopping early
            pool.terminate()
            raise
        else:
            pool.close()  # every task done: the workers leave on their own
        finally:
            pool.join()


def _build(path: str, shards: ShardList, layout: str, rule: LabelRule, fields: dict,
           workers: Optional[int], retry: Optional[RetryPolicy] = None, keep_in: Optional[ShardReader] = None,
           why: str = 'no index yet') -> None:
    folder = osp.dirname(osp.abspath(path))
    os.makedirs(folder, exist_ok=True)
    parts = parts_folder(path)
    keeps = _keeps(shards, fields['fingerprints'], keep_in)
    tasks, problems = _tasks(shards, layout, rule, retry, keeps)
    part_files = [osp.join(parts, _part_name(task, fields['fingerprints'][task[1]], layout, rule))
                  for task in tasks]
    earlier = {i: part for i, part in enumerate(part_files) if osp.exists(part)}
    todo = [task for i, task in enumerate(tasks) if i not in earlier]
    bad_shards = set()
    workers = workers or os.cpu_count() or 1
    spooled = {'names': SpooledArray(np.uint8, folder), 'name_offsets': SpooledArray(np.int64, folder),
               'offsets': SpooledArray(np.int64, folder), 'sizes': SpooledArray(np.int64, folder),
               'labels': SpooledArray(np.int32, folder)}
    key_hashes: List[np.ndarray] = []
    synset_ids: Dict[str, int] = {}
    listed = None if rule.synsets is None else {s: i for i, s in enumerate(rule.synsets)}
    shard_counts = [0] * len(shards.names)
    total, name_bytes, started, last = 0, 0, time.time(), time.time()
    spooled['name_offsets'].append(np.zeros(1, np.int64))
    unit = 'shards' if layout == 'webdataset' else 'inner tars'
    resumed = f'; {len(earlier):,} scanned by an earlier build, kept in {parts}' if earlier else ''
    kept = sum(k is not None for k in keeps)
    cached = (f'; {kept:,} of {len(keeps):,} shards scanned through the chunk cache {keep_in.cache_root}'
              if kept else '')
    print_log(f'Indexing {len(tasks):,} {unit} of {shards.base} with {min(workers, max(1, len(todo)))} processes '
              f'({why}; the index goes to {path}{resumed}{cached})', logger='current')
    os.makedirs(parts, exist_ok=True)
    scans = _scans(todo, workers)
    try:
        for done, task in enumerate(tasks, 1):
            position, shard, _, url = task[:4]
            if position in earlier:
                scan = _load_part(earlier[position])
                if scan is None:  # unreadable: scan it again, here
                    scan = _run_task(task)[1]
            else:
                scan = next(scans)[1]
                if not isinstance(scan, TarIndexError):
                    _save_part(part_files[position], scan)
            if isinstance(scan, TarIndexError):  # a bad shard: noted, and the others scanned
                problems.append(str(scan))
                bad_shards.add(shard)
                continue
            n = len(scan.names)
            if rule.source == 'synset':
                if listed is not None:
                    labels = [listed.get(s, -1) for s in scan.synsets]
                    if -1 in labels:
                        at = labels.index(-1)
                        problems.append(f'{url}, sample {scan.names[at].decode()!r}: synset {scan.synsets[at]} '
                                        f'is not in the label space ({len(rule.synsets):,} classes); choose '
                                        f'the label space of this release')
                        bad_shards.add(shard)
                        continue
                else:  # provisional numbers in order of appearance, sorted at the end
                    labels = [synset_ids.setdefault(s, len(synset_ids)) for s in scan.synsets]
            else:
                labels = scan.labels
            lengths = np.fromiter((len(b) for b in scan.names), np.int64, n)
            spooled['names'].append(np.frombuffer(b''.join(scan.names), np.uint8))
            spooled['name_offsets'].append(name_bytes + np.cumsum(lengths))
            spooled['offsets'].append(np.asarray(scan.offsets, np.int64))
            spooled['sizes'].append(np.asarray(scan.sizes, np.int64))
            spooled['labels'].append(np.asarray(labels, np.int64))
            key_hashes.append(_key_hashes(scan.names))
            name_bytes += int(lengths.sum())
            total += n
            shard_counts[shard] += n
            if time.time() - last > _PROGRESS_S:
                last = time.time()
                fresh = done - sum(1 for p in earlier if p < done)
                rate = fresh / (last - started) if fresh else 0.0
                left = (f', about {_duration((len(tasks) - done) / rate)} left' if rate else '')
                print_log(f'Indexing: {done:,}/{len(tasks):,} {unit}, {total:,} samples, '
                          f'{_duration(last - started)}{left}', logger='current')
        if shards.counts is not None:
            for i, (have, want) in enumerate(zip(shard_counts, shards.counts)):
                if have != want and i not in bad_shards:
                    problems.append(f'{shards.url(i)}: {have:,} samples, but {shards.info_file} says {want:,}; '
                                    f'the shard is truncated or replaced: download it again')
        if problems:
            raise _all_problems(problems, shards.base)
        if total == 0:
            raise TarIndexError(f'{shards.base}: the shards hold no sample; check data_root and shards')
        synsets = rule.synsets
        if rule.source == 'synset' and listed is None:
            synsets = tuple(sorted(synset_ids))
            rank = {s: i for i, s in enumerate(synsets)}
            order = np.empty(len(synset_ids), np.int32)
            for s, provisional in synset_ids.items():
                order[provisional] = rank[s]
            labels = SpooledArray(np.int32, folder)
            try:
                for chunk in spooled['labels'].chunks():
                    labels.append(order[chunk])
            except BaseException:
                labels.close()
                raise
            spooled['labels'].close()
            spooled['labels'] = labels
        arrays = dict(spooled)
        arrays['shard_starts'] = np.concatenate([[0], np.cumsum(shard_counts)]).astype(np.int64)
        count, rows = _duplicates(np.concatenate(key_hashes))
        fields = dict(fields, synsets=list(synsets) if synsets is not None and listed is None else None,
                      num_samples=total, duplicate_keys={'count': count, 'rows': rows})
        write_array_file(path, fields, arrays)
    finally:
        scans.close()  # its pool of workers ends, however the loop ended
        for array in spooled.values():
            array.close()
        if osp.isdir(parts) and not os.listdir(parts):
            os.rmdir(parts)
    shutil.rmtree(parts, ignore_errors=True)  # the index holds it all
    print_log(f'Indexed {total:,} samples of {len(shards.names):,} shards in {time.time() - started:.1f} s',
              logger='current')


# ------------------------------------------------------------------------------ resumable builds, sharing
def parts_folder(index_path: str) -> str:
    """Where a build keeps each scanned shard's rows until the index is written (``<index>.parts``): a
    build stopped for any reason (killed, bad shards) scans only the shards not done, or changed, when it
    starts again."""
    return index_path + '.parts'


def _part_name(task: tuple, version: dict, layout: str, rule: LabelRule) -> str:
    """A scan's file in :func:`parts_folder`: named by the shard's URL and fingerprint, the unit of the
    shard (an inner tar's place), the layout and the label rule."""
    _, _, kind, url, args = task[:5]
    what = [FORMAT_VERSION, url, version, kind, list(args) if kind == 'inner' else None, layout, rule.describe()]
    return hashlib.sha1(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()[:24] + '.npz'


def _save_part(path: str, scan: _Scan) -> None:
    """A scan's rows, written whole or not at all (a temporary name moved into place)."""
    arrays = {'names': np.frombuffer(b''.join(scan.names), np.uint8),
              'lengths': np.fromiter((len(b) for b in scan.names), np.int64, len(scan.names)),
              'offsets': np.asarray(scan.offsets, np.int64), 'sizes': np.asarray(scan.sizes, np.int64),
              'labels': np.asarray(scan.labels, np.int64),
              'synsets': np.frombuffer('\n'.join(scan.synsets).encode(), np.uint8)}
    tmp = f'{path}.{os.getpid()}.tmp'
    try:
        with open(tmp, 'wb') as f:
            np.savez(f, **arrays)
        os.replace(tmp, path)
    except OSError:  # a full disk costs the resumability of this shard, not the build
        if osp.exists(tmp):
            os.unlink(tmp)


def _load_part(path: str) -> Optional[_Scan]:
    try:
        with np.load(path, allow_pickle=False) as z:
            names, lengths = z['names'].tobytes(), z['lengths']
            scan = _Scan()
            scan.offsets, scan.sizes, scan.labels = z['offsets'].tolist(), z['sizes'].tolist(), z['labels'].tolist()
            synsets = z['synsets'].tobytes().decode()
    except (OSError, ValueError, KeyError, EOFError):
        return None
    ends = np.cumsum(lengths).tolist()
    scan.names = [names[a:b] for a, b in zip([0] + ends[:-1], ends)]
    scan.synsets = synsets.split('\n') if synsets else []
    return scan


def _keeps(shards: ShardList, versions: List[dict], keep_in: Optional[ShardReader]) -> List[Optional[tuple]]:
    """``(reader, fingerprint)`` for the remote shards, in order, that fit the reader's cache together
    (:meth:`ShardReader.scan_room`); None for the others, scanned past the cache."""
    keeps: List[Optional[tuple]] = [None] * len(shards.names)
    if keep_in is None:
        return keeps
    room = keep_in.scan_room()
    for i, version in enumerate(versions):
        size = int(version.get('size') or 0)
        if not is_remote(shards.url(i)) or size > room:
            break
        room -= size
        keeps[i] = (keep_in, version)
    return keeps


def _key_hashes(names: List[bytes]) -> np.ndarray:
    """A 64-bit hash of each sample's key (:meth:`TarShardIndex.key`)."""
    out = np.empty(len(names), np.uint64)
    for i, name in enumerate(names):
        key = _split_key(name.rpartition(b'/')[2].decode('utf-8', 'replace'))[0]
        out[i] = int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), 'little')
    return out


def _duplicates(hashes: np.ndarray, examples: int = 5) -> Tuple[int, List[List[int]]]:
    """The number of rows whose key an earlier row has, and ``[earlier row, row]`` of the first few."""
    order = np.argsort(hashes, kind='stable')
    ordered = hashes[order]
    same = ordered[1:] == ordered[:-1]
    count = int(same.sum())
    if not count:
        return 0, []
    repeats = np.sort(order[1:][same])[:examples]
    return count, [[int(order[np.searchsorted(ordered, hashes[r])]), int(r)] for r in repeats]


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    if seconds < 120:
        return f'{seconds} s'
    if seconds < 7200:
        return f'{seconds // 60} min {seconds % 60:02d} s'
    return f'{seconds // 3600} h {seconds % 3600 // 60:02d} min'


def _why_rebuilt(path: str, expect: dict) -> str:
    """Why the index at ``path`` does not serve ``expect``: missing, damaged, other settings, or the
    shards that changed (size, modification time or version), were added or removed."""
    if not osp.exists(path):
        return 'no index yet'
    header = read_array_header(path)
    if header is None:
        return f'{path} is damaged'
    for key in ('kind', 'version', 'layout', 'label', 'base'):
        if header.get(key) != expect[key]:
            return f'rebuilt: its {key} was {header.get(key)!r}, the dataset has {expect[key]!r}'
    old = dict(zip(header.get('shards') or [], header.get('fingerprints') or []))
    new = dict(zip(expect['shards'], expect['fingerprints']))
    changes = []
    for name, version in new.items():
        before = old.get(name)
        if before is None:
            changes.append(f'{name} added')
        elif before != version:
            changed = ', '.join(f'{k} {before.get(k)} -> {version.get(k)}' for k in sorted(set(before) | set(version))
                                if before.get(k) != version.get(k))
            changes.append(f'{name} changed ({changed})')
    changes += [f'{name} removed' for name in old if name not in new]
    if not changes:
        return 'rebuilt: the shards are listed in another order' if list(old) != list(new) else f'{path} is damaged'
    more = f'; and {len(changes) - 3:,} more' if len(changes) > 3 else ''
    return f'rebuilt: {len(changes):,} shard(s) differ: ' + '; '.join(changes[:3]) + more


class _BuildLock:
    """A non-blocking exclusive lock on ``<index>.lock``: the one process (of every process that can see
    the file, on every node of a shared file system) that holds it builds; the lock goes with its process."""

    def __init__(self, path: str):
        self.path, self.fd = path, -1

    def acquire(self) -> bool:
        """True when this process holds the lock, or the file system takes no locks (then each builds)."""
        import fcntl  # POSIX only
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError:
            return True
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            os.close(fd)
            return err.errno not in (errno.EACCES, errno.EAGAIN)
        self.fd = fd
        return True

    def release(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def _build_or_wait(path: str, shards: ShardList, layout: str, rule: LabelRule, expect: dict, workers: Optional[int],
                   retry: Optional[RetryPolicy], keep_in: Optional[ShardReader], wait_s: Optional[float],
                   rebuild: bool):
    """Build the index, or wait for the process that builds it: polling the file (no collective, so no
    process group's timeout applies), logging that build's progress, for up to ``wait_s`` seconds. A
    waiter whose builder died takes the build over, from what it scanned."""
    why = 'a rebuild was asked for' if rebuild else _why_rebuilt(path, expect)
    os.makedirs(osp.dirname(osp.abspath(path)), exist_ok=True)
    lock = _BuildLock(path + '.lock')
    started, logged, seen = time.time(), 0.0, None
    while True:
        if lock.acquire():
            try:
                found = None if rebuild else read_array_file(path, expect)
                if found is None:
                    _build(path, shards, layout, rule, expect, workers, retry, keep_in, why)
                    found = read_array_file(path, expect)
                    if found is None:
                        raise TarIndexError(f'{path}: the index changed while it was opened (a shard was '
                                            f'replaced meanwhile?); start again')
                return found
            finally:
                lock.release()
        found = read_array_file(path, expect)
        if found is not None:
            return found
        now = time.time()
        parts = parts_folder(path)
        done = len([n for n in os.listdir(parts) if n.endswith('.npz')]) if osp.isdir(parts) else 0
        seen = (now, done) if seen is None else seen
        if wait_s is not None and now - started > wait_s:
            raise TarIndexError(f'{path}: waited {_duration(now - started)} (index_wait_s) for another process '
                                f'to build it ({done:,} done).\nBuild it ahead with `python tools/build_index.py '
                                f'CONFIG`, or raise index_wait_s.')
        if now - logged >= _WAIT_LOG_S:
            logged = now
            rate = (done - seen[1]) / (now - seen[0]) if now > seen[0] else 0.0
            if layout == 'webdataset':
                left = f', about {_duration((len(shards.names) - done) / rate)} left' if rate > 0 else ''
                progress = f'{done:,}/{len(shards.names):,} shards done{left}'
            else:
                progress = f'{done:,} inner tars done'
            print_log(f'Waiting for another process to build the index {path} ({why}): {progress}; '
                      f'{_duration(now - started)} waited of index_wait_s={wait_s}', logger='current')
        time.sleep(_POLL_S)


__all__ = ['LAYOUTS', 'LABEL_SOURCES', 'IMAGE_EXTENSIONS', 'LabelRule', 'ShardList', 'TarIndexError',
           'TarShardIndex', 'expand_braces', 'resolve_shards', 'default_index_path', 'parts_folder',
           'shard_fingerprints']
