"""The tar-shard index: where each image's bytes lie in its shard, and its label (docs/data.md#the-index).

:class:`TarShardIndex` opens the index file (an :mod:`~vit_plugin.datasets.array_file`), building it
(:mod:`~vit_plugin.datasets.tar_index_build`) when it is missing or a shard changed. Shard lists come from
:mod:`~vit_plugin.datasets.tar_shards`, the scans from :mod:`~vit_plugin.datasets.tar_scan`.
"""
import hashlib
import json
import logging
import os
import os.path as osp
from typing import Dict, List, Optional, Tuple

import numpy as np
from mmengine.logging import print_log

from vit_plugin.datasets.array_file import read_array_file
from vit_plugin.datasets.indexed import check_label_range
from vit_plugin.datasets.shards import (RetryPolicy, ShardReader, ShardReadError, fingerprint,
                                        fingerprints_in_folder, is_remote, join_url, local_path)
from vit_plugin.datasets.tar_index_build import build_or_wait, parts_folder
from vit_plugin.datasets.tar_scan import (IMAGE_EXTENSIONS, STORE_ERRORS, LabelRule, TarIndexError, all_problems,
                                         split_key)
from vit_plugin.datasets.tar_shards import ShardList, expand_braces, resolve_shards

LAYOUTS = ('webdataset', 'tar_of_tars')
LABEL_SOURCES = ('cls', 'json', 'synset')
INDEX_KIND = 'vit_plugin.tar_shards'
FORMAT_VERSION = 1
DUPLICATE_KEYS = ('warn', 'error')


def default_index_dir() -> str:
    """Where indexes of remote or read-only shards go: ``$VIT_PLUGIN_CACHE/shard_index`` (``~/.cache/vit_plugin``)."""
    root = os.environ.get('VIT_PLUGIN_CACHE') or osp.join(osp.expanduser('~'), '.cache', 'vit_plugin')
    return osp.join(root, 'shard_index')


def default_index_path(shards: ShardList, layout: str, rule: LabelRule, split: Optional[str]) -> str:
    """The index file of these shards: a hidden folder beside local, writable shards, else
    :func:`default_index_dir`; the name holds a hash of the shards and the settings."""
    digest = hashlib.sha1(json.dumps([shards.data_root, list(shards.names), layout, rule.describe()]).encode()
                          ).hexdigest()[:16]
    name = f'{split or "shards"}-{digest}.index'
    if not is_remote(shards.data_root):
        folder = osp.join(local_path(shards.data_root), '.vit_plugin_index')
        try:
            os.makedirs(folder, exist_ok=True)
            if os.access(folder, os.W_OK):
                return osp.join(folder, name)
        except OSError:
            pass
    return osp.join(default_index_dir(), name)


def shard_fingerprints(shards: ShardList, retry: Optional[RetryPolicy] = None) -> List[dict]:
    """The fingerprint of every shard (one listing per remote folder); one error names each missing shard."""
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
        except STORE_ERRORS:
            raise
        except ShardReadError as err:
            problems.append(f'{url}: missing or unreadable ({err.reason or err}); check data_root and the '
                            f'shard names, or download the shard')
    if problems:
        raise all_problems(problems, shards.data_root)
    return result


class TarShardIndex:
    """The samples of tar shards in memory-mapped arrays (use :meth:`open`), in the shards' and the tars' order.

    Row ``i``: the bytes ``offsets[i]`` + ``sizes[i]`` of shard ``shard_of(i)``, label ``labels[i]``, image
    :meth:`member`. Read-only: copies share it; pickling sends the file name.
    """

    def __init__(self, path: str, header: dict, arrays: Dict[str, np.ndarray]):
        self.path, self.header = path, header
        self.names_data, self.name_offsets = arrays['names'], arrays['name_offsets']
        self.offsets, self.sizes, self.labels = arrays['offsets'], arrays['sizes'], arrays['labels']
        self.shard_starts = arrays['shard_starts']
        self.data_root: str = header['base']  # the file's key: renaming it would rebuild every index
        self.shard_names: Tuple[str, ...] = tuple(header['shards'])
        self.fingerprints: Tuple[dict, ...] = tuple(header['fingerprints'])
        self.synsets: Optional[Tuple[str, ...]] = (tuple(header['synsets']) if header.get('synsets') is not None
                                                   else None)

    @property
    def base(self) -> str:
        """Alias of ``data_root``."""
        return self.data_root

    @classmethod
    def open(cls, shards: ShardList, layout: str = 'webdataset', rule: LabelRule = LabelRule(),
             num_classes: Optional[int] = None, index_path: Optional[str] = None, split: Optional[str] = None,
             workers: Optional[int] = None, rebuild: bool = False,
             retry: Optional[RetryPolicy] = None, keep_in: Optional[ShardReader] = None,
             wait_s: Optional[float] = None, duplicate_keys: str = 'warn') -> 'TarShardIndex':
        """Open the index of ``shards``, building it (or waiting ``wait_s`` for the process that builds it)
        when it is missing or a shard changed.

        Args:
            shards (ShardList): From :func:`resolve_shards`.
            layout, rule: The layout (:data:`LAYOUTS`) and where labels come from.
            num_classes (int, optional): Check every label against ``[0, num_classes)``.
            index_path (str, optional): The index file; default :func:`default_index_path` (named by ``split``).
            workers (int, optional): Processes that scan shards; default every core.
            rebuild (bool): Build even when the index is current.
            retry (RetryPolicy, optional): How remote reads wait out an outage.
            keep_in (ShardReader, optional): Scan remote shards through this reader's chunk cache.
            duplicate_keys (str): Rows sharing a sample key: ``'warn'`` or ``'error'``.

        Raises:
            TarIndexError: Bad input (docs/data.md#bad-input; nothing written), or ``wait_s`` passed.
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
                  'base': shards.data_root, 'shards': list(shards.names),
                  'fingerprints': shard_fingerprints(shards, retry)}
        found = None if rebuild else read_array_file(path, expect)
        if found is None:
            found = build_or_wait(path, shards, layout, rule, expect, workers, retry, keep_in, wait_s, rebuild)
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
        return join_url(self.data_root, self.shard_names[shard])

    def member(self, row: int) -> str:
        """The image member's name (``<inner>.tar/<name>`` in a tar of tars)."""
        return self.names_data[self.name_offsets[row]:self.name_offsets[row + 1]].tobytes().decode('utf-8')

    def key(self, row: int) -> str:
        """The sample's key: the image member's name without folders and extensions."""
        return split_key(self.member(row).rpartition('/')[2])[0]

    def location(self, row: int) -> str:
        """``<shard url>:<member>``, how messages name a sample."""
        return f'{self.shard_url(self.shard_of(row))}:{self.member(row)}'

    def check_labels(self, num_classes: int) -> None:
        """Raise :class:`TarIndexError` naming the first sample whose label is outside ``[0, num_classes)``."""
        check_label_range(self.labels, num_classes, self.location, TarIndexError)

    def check_duplicates(self, policy: str = 'warn') -> None:
        """Warn (``'warn'``) or raise :class:`TarIndexError` (``'error'``) when rows share a sample key."""
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
        print_log(f'{self.data_root}: {count:,} samples repeat the key of an earlier one, e.g. '
                  f'{"; ".join(examples)}. '
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




__all__ = ['LAYOUTS', 'LABEL_SOURCES', 'IMAGE_EXTENSIONS', 'LabelRule', 'ShardList', 'TarIndexError',
           'TarShardIndex', 'expand_braces', 'resolve_shards', 'default_index_path', 'parts_folder',
           'shard_fingerprints']
