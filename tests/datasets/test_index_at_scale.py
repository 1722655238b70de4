"""The tar index at scale: a remote scan keeps its chunks for the first epoch, a rebuilt index says
why, and duplicate sample keys are counted (docs/data.md#the-index). The shards are a few toy ones;
remote reads go to a loopback server on 127.0.0.1 that counts the bytes it sends."""
import os
import os.path as osp
import shutil

import pytest

from helpers.common import LogLines
from mmengine.logging import MMLogger

from helpers.tar_shards import make_samples, write_wds
from benchmarks.loopback_http import serve_folder
from vit_plugin.datasets import TarShardDataset
from vit_plugin.datasets.tar_index import TarIndexError

PER_SHARD = (12, 10, 11)
CHUNK = 1 << 14  # several chunks per shard


@pytest.fixture(scope='module')
def shards(tmp_path_factory):
    folder = str(tmp_path_factory.mktemp('wds'))
    write_wds(folder, make_samples(sum(PER_SHARD), seed=5, size=64), PER_SHARD, info=False)
    return folder


@pytest.fixture
def logs(request):
    handler = LogLines()
    logger = MMLogger.get_instance(request.node.name, log_level='INFO')
    logger.addHandler(handler)
    yield handler.lines
    logger.removeHandler(handler)


def open_dataset(root, **kwargs):
    kwargs.setdefault('index_workers', 1)
    return TarShardDataset(root, split='train', **kwargs)


def shard_bytes(folder):
    return sum(os.path.getsize(osp.join(folder, n)) for n in os.listdir(folder) if n.endswith('.tar'))


def served_for_index_and_epoch(shards, tmp_path, cache_bytes):
    """Bytes the server sent for the index build (2 processes) and reading every sample once."""
    with serve_folder(shards) as server:
        reader = dict(cache_dir=str(tmp_path / 'chunks'), chunk_bytes=CHUNK, readahead_chunks=1,
                      cache_bytes=cache_bytes)
        dataset = open_dataset(server.url, reader=reader, index_file=str(tmp_path / 'remote.index'),
                               index_workers=2)
        for i in range(len(dataset)):
            dataset.reader.read(*_range(dataset, i))
        dataset.reader.close()
        return server.bytes_sent


def _range(dataset, i):
    index = dataset._index
    shard = index.shard_of(i)
    return index.shard_url(shard), int(index.offsets[i]), int(index.sizes[i]), index.fingerprints[shard]


def test_a_remote_scan_keeps_its_chunks_so_the_first_epoch_fetches_nothing_again(shards, tmp_path):
    total = shard_bytes(shards)
    kept = served_for_index_and_epoch(shards, tmp_path / 'kept', cache_bytes=100 * total)
    past = served_for_index_and_epoch(shards, tmp_path / 'past', cache_bytes=CHUNK * 3)  # holds no shard
    assert kept <= 1.05 * total  # each byte once: the scan's chunks serve the reads
    assert past >= 1.9 * total  # scanned past the cache, then fetched again by the reads


def test_a_rebuilt_index_names_the_shard_that_changed_and_how(shards, tmp_path, logs):
    folder = str(tmp_path / 'wds')
    shutil.copytree(shards, folder)
    open_dataset(folder)
    name = sorted(n for n in os.listdir(folder) if n.endswith('.tar'))[1]
    with open(osp.join(folder, name), 'ab') as f:
        f.write(b'\0' * 1024)  # one more end block: same samples, another size
    open_dataset(folder)
    rebuilt = [line for line in logs if line.startswith('Indexing')]
    assert 'no index yet' in rebuilt[0]
    size = os.path.getsize(osp.join(folder, name))
    assert f'rebuilt: 1 shard(s) differ: {name} changed (' in rebuilt[1]
    assert f'size {size - 1024} -> {size}' in rebuilt[1]
    assert 'mtime_ns' in rebuilt[1]


def test_duplicate_keys_across_shards_are_counted_with_examples_or_refused(shards, tmp_path, logs):
    folder = str(tmp_path / 'wds')
    shutil.copytree(shards, folder)
    names = sorted(n for n in os.listdir(folder) if n.endswith('.tar'))
    shutil.copy(osp.join(folder, names[0]), osp.join(folder, names[2]))  # a shard replaced by a copy
    dataset = open_dataset(folder)
    assert len(dataset) == 2 * PER_SHARD[0] + PER_SHARD[1]  # each row is read: the image twice
    warned = [line for line in logs if 'repeat the key' in line]
    assert len(warned) == 1 and f'{PER_SHARD[0]} samples repeat the key of an earlier one' in warned[0]
    first_key = dataset._index.key(0)
    assert f"'{first_key}' in {names[0]} and {names[2]}" in warned[0]
    with pytest.raises(TarIndexError, match=f'{PER_SHARD[0]} samples repeat the key') as err:
        open_dataset(folder, duplicate_keys='error')
    assert all(len(line) <= 100 for line in str(err.value).splitlines())
