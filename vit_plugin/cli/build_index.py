"""``tools/build_index.py``: build the index of a config's tar-shard datasets once, ahead of training.

    python tools/build_index.py CONFIG [--val] [--workers N] [--cfg-options key=value ...]

It builds, with every core, the index of each ``vit_plugin.TarShardDataset`` in the config's
``train_dataloader`` (``--val``: and in ``val_dataloader`` / ``test_dataloader``) where the dataset reads
it (``index_file``, else the default beside local shards or under ``VIT_PLUGIN_CACHE``), logging its
progress with the time left. A build that stops (killed, bad shards) keeps the shards it scanned
beside the index; run the command again and it scans only the others. The training run that follows
opens the index without scanning. For a job of several nodes, put the index where every node reads it
(``--cfg-options train_dataloader.dataset.index_file=/shared/...``, the same in the training command).
docs/data.md#the-index tells the story.
"""
import argparse
from typing import Iterator, List, Optional, Sequence

from mmengine.config import Config, DictAction

from vit_plugin.datasets.shard_dataset import TarShardDataset
from vit_plugin.datasets.shards.errors import ShardReadError
from vit_plugin.datasets.tar_index import TarIndexError

from .launch import merge_cfg_options

_SECTIONS = ('train_dataloader', 'val_dataloader', 'test_dataloader')


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Build the index of a config's tar-shard datasets.")
    parser.add_argument('config', help='config file path')
    parser.add_argument('--val', action='store_true', help='also the validation and test datasets')
    parser.add_argument('--workers', type=int, help='processes that scan shards (default: every core)')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction, metavar='KEY=VALUE',
                        help='override config entries (as tools/train.py takes them)')
    return parser.parse_args(argv)


def shard_datasets(node) -> Iterator[dict]:
    """The ``TarShardDataset`` configs inside a dataset config (wrappers such as ``ConcatDataset`` or
    ``ClassBalancedDataset`` included)."""
    if isinstance(node, dict):
        kind = node.get('type')
        if kind is TarShardDataset or (isinstance(kind, str) and kind.rpartition('.')[2] == 'TarShardDataset'):
            yield node
            return
        for value in node.values():
            yield from shard_datasets(value)
    elif isinstance(node, (list, tuple)):
        for value in node:
            yield from shard_datasets(value)


def build_indexes(cfg: Config, val: bool = False, workers: Optional[int] = None) -> List[str]:
    """Build (or find current) the index of every tar-shard dataset of ``cfg``; the lines to print."""
    lines = []
    for section in _SECTIONS[:3 if val else 1]:
        loader = cfg.get(section) or {}
        for dataset_cfg in shard_datasets(loader.get('dataset')):
            kwargs = {k: v for k, v in dataset_cfg.items() if k not in ('type', 'pipeline')}
            if workers:
                kwargs['index_workers'] = workers
            dataset = TarShardDataset(**kwargs, lazy_init=False)
            lines.append(f'{section}: {len(dataset):,} samples of {dataset.shard_root}; index {dataset.index_path}')
    return lines


def main(argv: Optional[Sequence[str]] = None) -> None:
    args = parse_args(argv)
    cfg = Config.fromfile(args.config)
    merge_cfg_options(cfg, args.cfg_options)
    try:
        lines = build_indexes(cfg, args.val, args.workers)
    except (TarIndexError, ShardReadError) as err:  # bad shards (each named), an unreachable store
        raise SystemExit(f'ERROR: {err}') from None
    if not lines:
        raise SystemExit(f'{args.config}: no vit_plugin.TarShardDataset in '
                         f'{"the dataloaders" if args.val else "train_dataloader"}; nothing to index.')
    print('\n'.join(lines))
