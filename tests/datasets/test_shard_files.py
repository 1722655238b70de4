"""vit_plugin.datasets.shard_files, the alias of vit_plugin.datasets.shards: its names are the package's,
and reads through it behave end to end (a loopback HTTP server, benchmarks.loopback_http; a
port nothing listens at).
"""
import gc
import multiprocessing
import threading

import pytest

from helpers.common import free_port
from benchmarks.loopback_http import serve_folder
from vit_plugin.datasets import shard_files
from vit_plugin.datasets import shards
from vit_plugin.datasets.shard_files import ShardReader, ShardUnavailableError, fingerprint
from helpers.toy_shards import make_shard_folder


@pytest.fixture(scope='module')
def srv(tmp_path_factory):
    with serve_folder(make_shard_folder(tmp_path_factory.mktemp('shards'))['root']) as server:
        yield server


def test_every_public_name_is_the_packages():
    import vit_plugin.datasets as datasets
    assert shard_files.__all__ == shards.__all__ and len(shard_files.__all__) == 26
    assert all(getattr(shard_files, name) is getattr(shards, name) for name in shards.__all__)
    assert all(getattr(datasets, name) is getattr(shards, name)
               for name in ('ShardReader', 'ShardReadError', 'fingerprint', 'open_for_scan', 'list_shards_in_folder'))
    assert (shard_files.DEFAULT_CHUNK_BYTES, shard_files.DEFAULT_RETRY_TIMEOUT_S) == (16 << 20, 600.0)


def test_a_store_nothing_listens_at_is_unavailable_after_the_retries(tmp_path):
    url = f'http://127.0.0.1:{free_port()}/s0.tar'
    with ShardReader(cache_dir=str(tmp_path), retries=1, backoff_s=0.0) as reader, \
            pytest.raises(ShardUnavailableError) as err:
        reader.read(url, 0, 100, {'size': 1000})
    assert err.value.url == url and '2 tries' in str(err.value)


def test_a_forked_child_leaves_the_parents_connections_alone(srv):
    """A data-loader or index worker forked after the parent read over HTTP reads on its own; the parent's
    pooled connections keep working (a child closing its copy of the parent's aiohttp ClientSession would take the
    parent's sockets out of the epoll set they share, and the parent's next read would hang)."""
    url = srv.url + '/s0.tar'
    before = fingerprint(url)  # the parent now holds a ClientSession with a pooled connection

    def child():
        fingerprint(url)
        gc.collect()

    process = multiprocessing.get_context('fork').Process(target=child)
    process.start()
    process.join(60)
    assert process.exitcode == 0
    result = []
    reader = threading.Thread(target=lambda: result.append(fingerprint(url)), daemon=True)
    reader.start()
    reader.join(20)
    assert result == [before], 'the parent\'s read after the fork hangs'
