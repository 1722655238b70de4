"""vit_plugin.datasets.shards.local, through a ShardReader on local files: ``pread`` on open descriptors."""
import os
import os.path as osp
import shutil

import pytest

from vit_plugin.datasets.shards import ShardNotFoundError, ShardReadError, ShardReader
from vit_plugin.datasets.shards.local import OpenFiles


def test_local_reads_return_the_members_bytes(shards):
    path = osp.join(shards['root'], 's0.tar')
    with ShardReader() as reader:
        got = [reader.read(path, off, n) for off, n in shards['members']['s0.tar']]
    assert got == [shards['data']['s0.tar'][off:off + n] for off, n in shards['members']['s0.tar']]


def test_local_shard_stays_open_between_reads(shards, tmp_path):
    """Reads after the first open no file: they keep working after the file's name is gone."""
    path = str(tmp_path / 'copy.tar')
    shutil.copy(osp.join(shards['root'], 's0.tar'), path)
    (off, n), (off2, n2) = shards['members']['s0.tar'][:2]
    with ShardReader() as reader:
        reader.read(path, off, n)
        os.unlink(path)
        assert reader.read(path, off2, n2) == shards['data']['s0.tar'][off2:off2 + n2]


def test_open_files_keep_the_most_recently_used(shards):
    files = OpenFiles(limit=1)
    first, second = (osp.join(shards['root'], name) for name in ('s0.tar', 's1.tar'))
    opened = files.open(first)
    assert files.open(first) is opened and first in files
    files.open(second)
    assert first not in files and second in files
    files.close()
    assert second not in files


def test_local_read_past_the_end_is_a_truncated_shard_error(shards):
    path = osp.join(shards['root'], 's0.tar')
    size = len(shards['data']['s0.tar'])
    with ShardReader() as reader, pytest.raises(ShardReadError, match='truncated') as err:
        reader.read(path, size - 10, 20)
    assert err.value.url == path


def test_missing_local_shard_is_a_not_found_error(tmp_path):
    with ShardReader() as reader, pytest.raises(ShardNotFoundError, match='not found'):
        reader.read(str(tmp_path / 'nope.tar'), 0, 10)
