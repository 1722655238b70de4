"""Reading one tar: the samples of a WebDataset shard or of an inner tar, with their byte ranges and labels.

Bad input raises :class:`TarIndexError` naming the shard, the key and the value (docs/data.md#bad-input).
"""
import hashlib
import json
import os.path as osp
import re
import shlex
import tarfile
from typing import Iterator, List, NamedTuple, Optional, Tuple

from vit_plugin.datasets.shards import (HubOfflineError, RangesNotSupportedError, RetryPolicy,
                                        ShardUnavailableError, is_compressed_tar, is_remote, local_path,
                                        open_for_scan)

IMAGE_EXTENSIONS = ('jpg', 'jpeg', 'png', 'webp')

_BLOCK = 512
_SYNSET = re.compile(r'n\d{8}')
#: (magic bytes, compression, the tool whose ``-dc`` writes the decompressed bytes to stdout)
_COMPRESSION_MAGIC = ((b'\x1f\x8b', 'gzip', 'gzip'), (b'BZh', 'bzip2', 'bzip2'),
                      (b'\xfd7zXZ\x00', 'xz', 'xz'), (b'\x28\xb5\x2f\xfd', 'zstd', 'zstd'))
_SUFFIX_COMPRESSION = {'.tar.gz': 'gzip', '.tgz': 'gzip', '.tar.bz2': 'bzip2', '.tbz2': 'bzip2', '.tar.xz': 'xz',
                       '.txz': 'xz', '.tar.zst': 'zstd', '.tar.zstd': 'zstd'}
#: The most bad shards one error lists; it counts the rest.
MAX_LISTED = 20


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



def _decompressed_name(name: str) -> str:
    """``x.tar.gz`` / ``x.tgz`` -> ``x.tar``."""
    suffix = next(s for s in _SUFFIX_COMPRESSION if name.lower().endswith(s))
    return name[:-len(suffix)] + '.tar'


def decompress_command(url: str) -> str:
    """The shell command that writes the ``.tar`` of the compressed tar at ``url`` beside it (of a local
    copy, named by its file name, for a remote one)."""
    path = local_path(url) if not is_remote(url) else url.rstrip('/').rpartition('/')[2]
    kind = next(k for s, k in _SUFFIX_COMPRESSION.items() if path.lower().endswith(s))
    return f'{kind} -dc {shlex.quote(path)} > {shlex.quote(_decompressed_name(path))}'


def compressed_message(url: str) -> str:
    """For a shard named as a compressed tar (``.tar.gz``, ``.tgz``...)."""
    where = '' if not is_remote(url) else ' (on a local copy, then upload the .tar)'
    return (f'{url} is a compressed tar, which allows no random access: decompress it first{where}, e.g. '
            f'`{decompress_command(url)}`, and name the .tar in the config (shards=).')


def _compressed_content_message(url: str, kind: str, tool: str) -> str:
    """For a shard named ``.tar`` whose bytes are compressed."""
    remote = is_remote(url)
    path = url.rstrip('/').rpartition('/')[2] if remote else local_path(url)
    raw = shlex.quote(path + '.raw')
    command = f'{tool} -dc {shlex.quote(path)} > {raw} && mv {raw} {shlex.quote(path)}'
    where = 'on a local copy, then upload it' if remote else 'in place'
    return (f'{url} holds {kind}-compressed data under a .tar name, which allows no random access: '
            f'decompress it first, {where}: `{command}`.')


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


def split_key(name: str) -> Tuple[str, str]:
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


class Scan:
    """The samples of one shard (or inner tar), in order: image member names, byte ranges, labels or
    synsets."""

    def __init__(self):
        self.names: List[bytes] = []
        self.offsets: List[int] = []
        self.sizes: List[int] = []
        self.labels: List[int] = []
        self.synsets: List[str] = []


def scan_webdataset(url: str, rule: LabelRule, retry: Optional[RetryPolicy] = None, keep: Optional[tuple] = None
                     ) -> Scan:
    scan = Scan()
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
            member_key, ext = split_key(member.name)
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


def scan_inner_tar(url: str, start: int, size: int, inner: str, retry: Optional[RetryPolicy] = None,
                    keep: Optional[tuple] = None) -> Scan:
    scan = Scan()
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


def inner_tars(url: str, retry: Optional[RetryPolicy] = None, keep: Optional[tuple] = None
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



#: Errors of the store, not of one shard: the build stops at the first.
STORE_ERRORS = (ShardUnavailableError, HubOfflineError, RangesNotSupportedError)


def all_problems(problems: List[str], base: str) -> TarIndexError:
    """One error for every bad shard found (the first :data:`MAX_LISTED`, and a count of the rest)."""
    if len(problems) == 1:
        return TarIndexError(problems[0])
    rest = len(problems) - MAX_LISTED
    listing = '\n'.join(f'- {p}' for p in problems[:MAX_LISTED])
    more = f'\n- and {rest:,} more' if rest > 0 else ''
    return TarIndexError(f'{base}: {len(problems):,} bad shards (every shard was scanned); fix or replace each, '
                         f'then start again:\n{listing}{more}')



__all__ = ['IMAGE_EXTENSIONS', 'MAX_LISTED', 'TarIndexError', 'LabelRule', 'Scan', 'scan_webdataset', 'scan_inner_tar',
           'inner_tars', 'split_key', 'all_problems']
