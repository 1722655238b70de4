"""The shards a dataset reads: a brace pattern, a list, a folder, or a split file (docs/data.md#how-shards-are-read)."""
import json
import os.path as osp
import re
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple, Union

from vit_plugin.datasets.shards import (RetryPolicy, compressed_tars_in_folder, is_compressed_tar, join_url,
                                        list_shards_in_folder, read_small_file)
from vit_plugin.datasets.tar_scan import TarIndexError, compressed_message, decompress_command

INFO_FILES = ('_info.json', 'info.json')


class ShardList(NamedTuple):
    """The shards of a split: their folder, their names in it, and each one's sample count from a split file."""
    data_root: str
    names: Tuple[str, ...]
    counts: Optional[Tuple[int, ...]] = None
    info_file: Optional[str] = None

    @property
    def base(self) -> str:
        """Alias of ``data_root``."""
        return self.data_root

    def url(self, i: int) -> str:
        return join_url(self.data_root, self.names[i])



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
    """The shards a dataset reads (``shards`` as :class:`~vit_plugin.datasets.shard_dataset.TarShardDataset`
    takes it; names relative to ``data_root`` or absolute).

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
                    f'`{decompress_command(join_url(data_root, packed[0]))}`' if packed else '')
            raise TarIndexError(f'{data_root}: no .tar shard' + (f' with {token!r} in its name' if token else '')
                                + f'{hint}. Set shards= (a brace pattern or a list) or data_root.')
    if not names:
        raise TarIndexError(f'{data_root}: the shard list is empty; set shards= to a brace pattern or a list')
    for name in names:
        if is_compressed_tar(name):
            raise TarIndexError(compressed_message(join_url(data_root, name)))
    counts = None
    if counts_by_name and all(osp.basename(n) in counts_by_name or n in counts_by_name for n in names):
        counts = tuple(counts_by_name.get(n, counts_by_name.get(osp.basename(n))) for n in names)
    return ShardList(data_root, tuple(names), counts, info_url if counts else None)



__all__ = ['INFO_FILES', 'ShardList', 'expand_braces', 'resolve_shards']
