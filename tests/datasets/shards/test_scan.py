"""vit_plugin.datasets.shards.scan: a remote tar's headers read in blocks, or through a reader's cache."""
import math
import tarfile

from helpers.toy_shards import CHUNK, chunk_files, remote_reader
from vit_plugin.datasets.shards.scan import open_for_scan


def test_scanning_a_remote_tar_costs_one_request_per_block(shards, srv):
    block = 128 << 10
    with open_for_scan(srv.url + '/s0.tar', block_bytes=block) as f, tarfile.open(fileobj=f, mode='r:') as tar:
        scanned = [(m.offset_data, m.size) for m in tar]
    assert scanned == shards['members']['s0.tar']
    assert srv.requests <= math.ceil(len(shards['data']['s0.tar']) / block) + 1  # + the HEAD for the size


def test_a_scan_through_a_reader_keeps_its_chunks_for_the_reads(shards, srv, tmp_path):
    url, members = srv.url + '/s1.tar', shards['members']['s1.tar']
    chunks = math.ceil(len(shards['data']['s1.tar']) / CHUNK)
    with remote_reader(tmp_path, readahead_chunks=0) as reader:
        with open_for_scan(url, keep_in=reader) as f, tarfile.open(fileobj=f, mode='r:') as tar:
            assert [(m.offset_data, m.size) for m in tar] == members
        assert len(chunk_files(reader.cache_root)) == chunks
        srv.reset_counts()
        got = [reader.read(url, off, n) for off, n in members]
    assert got == [shards['data']['s1.tar'][o:o + n] for o, n in members]
    assert all(r.range is None for r in srv.log)  # the fingerprint's HEAD at most: no chunk fetched again
