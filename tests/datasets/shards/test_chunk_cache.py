"""vit_plugin.datasets.shards.chunk_cache: remote shards read in chunks, one request each, kept on the
disk for every process of a node, within a bound, with read-ahead."""
import math
import os
import os.path as osp
import shutil
import time

import pytest

from helpers.toy_shards import CHUNK, chunk_files, read_every_member, remote_reader, run_forked
from vit_plugin.datasets.shards.errors import ShardReadError
from vit_plugin.datasets.shards.listing import fingerprint


def test_reading_every_member_costs_one_request_per_chunk(shards, srv, tmp_path):
    read_every_member(shards, srv, tmp_path, 's0.tar')
    assert srv.requests == math.ceil(len(shards['data']['s0.tar']) / CHUNK)
    assert all(r.method == 'GET' and r.range for r in srv.log)


def test_touching_a_chunk_fetches_the_next_ones_in_the_background(shards, srv, tmp_path):
    url = srv.url + '/s0.tar'
    fp = fingerprint(url)
    srv.reset_counts()
    reader = remote_reader(tmp_path, readahead_chunks=3)
    off, n = shards['members']['s0.tar'][0]
    reader.read(url, off, n, fp)
    deadline = time.monotonic() + 10
    while len(chunk_files(reader.cache_root)) < 4 and time.monotonic() < deadline:
        time.sleep(0.01)
    reader.close()
    assert sorted(r.range for r in srv.log) == sorted(f'bytes={k * CHUNK}-{(k + 1) * CHUNK - 1}' for k in range(4))


def test_a_fresh_reader_is_served_from_the_disk_cache(shards, srv, tmp_path):
    url = srv.url + '/s0.tar'
    fp = fingerprint(url)
    members = shards['members']['s0.tar']
    with remote_reader(tmp_path) as reader:
        for off, n in members:
            reader.read(url, off, n, fp)
    srv.reset_counts()
    with remote_reader(tmp_path) as fresh:
        got = [fresh.read(url, off, n, fp) for off, n in members]
    assert srv.requests == 0 and got == [shards['data']['s0.tar'][o:o + n] for o, n in members]


def test_the_cache_stays_within_its_bound_evicting_the_least_recently_used(shards, srv, tmp_path):
    url = srv.url + '/s1.tar'
    fp = fingerprint(url)
    bound = 5 * CHUNK
    with remote_reader(tmp_path, cache_bytes=bound, readahead_chunks=0) as reader:
        for off, n in shards['members']['s1.tar']:
            reader.read(url, off, n, fp)
        usage = reader.cache_usage()
        last = math.ceil(len(shards['data']['s1.tar']) / CHUNK) - 1
        kept = chunk_files(reader.cache_root)
    assert usage <= bound
    assert f'c{CHUNK}_{last}' in kept and f'c{CHUNK}_0' not in kept


def test_a_cut_transfer_leaves_no_chunk_and_a_later_read_is_exact(shards, srv, tmp_path):
    """The connection drops half-way through every try: the read fails naming the shard, and nothing in the
    cache can be taken for the chunk; the next read (the server healthy again) returns the right bytes."""
    url = srv.url + '/s0.tar'
    fp = fingerprint(url)
    srv.inject_faults(['cut', 'cut'])
    reader = remote_reader(tmp_path, retries=1, readahead_chunks=0)
    with pytest.raises(ShardReadError) as err:
        reader.read(url, 0, 1000, fp)
    assert err.value.url == url and chunk_files(reader.cache_root) == []
    assert reader.read(url, 0, 1000, fp) == shards['data']['s0.tar'][:1000]


def test_a_remote_shard_shorter_than_its_index_says_is_truncated(shards, srv, tmp_path):
    """The index was built on the whole shard, which was cut short since: reading its end says so."""
    path = osp.join(shards['root'], 'cut.tar')
    shutil.copy(osp.join(shards['root'], 's0.tar'), path)
    url = srv.url + '/cut.tar'
    fp = fingerprint(url)
    with open(path, 'r+b') as f:
        f.truncate(fp['size'] // 2)
    off, n = shards['members']['s0.tar'][-1]
    try:
        with remote_reader(tmp_path) as reader, pytest.raises(ShardReadError, match='truncated') as err:
            reader.read(url, off, n, fp)
        assert err.value.url == url
    finally:
        os.unlink(path)


def test_processes_sharing_a_cache_fetch_each_chunk_once(shards, tmp_path, loopback):
    """Two processes read the same shard at the same time through one cache folder (over a link with 20 ms
    of latency): the node fetches every chunk once."""
    with loopback(shards['root'], delay_s=0.02) as slow:
        url = slow.url + '/s1.tar'
        fp = fingerprint(url)
        slow.reset_counts()
        jobs = [(url, off, n, fp) for off, n in shards['members']['s1.tar']]
        got = run_forked([([remote_reader(tmp_path)], jobs)] * 2)
        expected = [shards['data']['s1.tar'][o:o + n] for _, o, n, _ in jobs]
        assert got == [[expected], [expected]]
        assert slow.requests == math.ceil(len(shards['data']['s1.tar']) / CHUNK)
