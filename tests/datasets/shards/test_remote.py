"""vit_plugin.datasets.shards.remote: ranged GETs, their retries through transient errors, servers without
ranges, and the hub (a stand-in on 127.0.0.1)."""
import contextlib
import functools
import hashlib
import math
import os.path as osp
import shutil
import tarfile
import threading
import time
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

import pytest

from helpers.common import free_port
from helpers.toy_shards import CHUNK, read_every_member, remote_reader
from vit_plugin.datasets.shards import remote
from vit_plugin.datasets.shards.errors import (HubOfflineError, RangesNotSupportedError, ShardNotFoundError,
                                               ShardReadError, ShardUnavailableError)
from vit_plugin.datasets.shards.listing import fingerprint
from vit_plugin.datasets.shards.remote import RetryPolicy, fetch_range
from vit_plugin.datasets.shards.scan import open_for_scan


def test_the_back_off_doubles_with_jitter_up_to_its_longest_wait():
    policy = RetryPolicy(backoff_s=1.0, max_backoff_s=5.0)
    waits = [[policy.delay(step) for _ in range(50)] for step in range(5)]
    for step, bound in enumerate((1, 2, 4, 5, 5)):
        assert all(bound / 2 <= w <= bound for w in waits[step]) and max(waits[step]) > 0.75 * bound


def test_a_range_is_its_bytes_and_past_the_end_none(shards, srv):
    data = shards['data']['s0.tar']
    assert fetch_range(srv.url + '/s0.tar', 100, 5000) == data[100:5000]
    assert fetch_range(srv.url + '/s0.tar', len(data) - 10, len(data) + 90) == data[-10:]
    assert fetch_range(srv.url + '/s0.tar', len(data) + 10, len(data) + 20) == b''


def test_transient_errors_are_retried(shards, srv, tmp_path):
    url = srv.url + '/s0.tar'
    fp = fingerprint(url)
    srv.reset_counts()
    srv.inject_faults([503, 'cut'])
    with remote_reader(tmp_path, retries=2, readahead_chunks=0) as reader:
        assert reader.read(url, 100, 5000, fp) == shards['data']['s0.tar'][100:5100]
    assert srv.requests == 3


def test_missing_remote_shard_is_a_not_found_error_without_retries(srv, tmp_path):
    with remote_reader(tmp_path) as reader, pytest.raises(ShardNotFoundError) as err:
        reader.read(srv.url + '/nope.tar', 0, 10)
    assert err.value.url == srv.url + '/nope.tar'
    assert srv.requests <= 2  # fsspec asks for the size with HEAD, then GET; a retry would ask again


@contextlib.contextmanager
def stdlib_server(folder):
    """Python's own ``http.server`` on 127.0.0.1, which ignores ``Range`` (200 and the whole file); yields
    its URL, the paths of the GET requests it received, and the bytes it sent for each whole answer."""
    gets, served = [], []

    class Handler(SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):
            gets.append(self.path)
            super().do_GET()

        def copyfile(self, source, outputfile):
            sent = 0
            try:
                for block in iter(lambda: source.read(16 << 10), b''):
                    outputfile.write(block)
                    sent += len(block)
            except OSError:  # the client closed the connection
                pass
            served.append(sent)

    httpd = ThreadingHTTPServer(('127.0.0.1', 0), functools.partial(Handler, directory=folder))
    thread = threading.Thread(target=httpd.serve_forever, kwargs=dict(poll_interval=0.05), daemon=True)
    thread.start()
    try:
        yield f'http://127.0.0.1:{httpd.server_address[1]}', gets, served
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join()


def test_a_server_that_ignores_ranges_is_refused_at_the_first_read(shards, tmp_path):
    """Python's http.server answers a range request with the whole file: the first read raises, naming the URL
    and what to use instead, after one request (no retry, no chunk-by-chunk whole-file transfers); a scan
    whose first block is the whole file reads it once, one that needs a second range is refused."""
    with stdlib_server(shards['root']) as (url, gets, served):
        shard = url + '/s0.tar'
        fp = fingerprint(shard)
        with remote_reader(tmp_path) as reader, pytest.raises(RangesNotSupportedError) as err:
            reader.read(shard, 5000, 100, fp)
        assert err.value.url == shard and gets == ['/s0.tar']
        assert 'Range support' in str(err.value) and 'download them and point data_root' in str(err.value)
        size = len(shards['data']['s0.tar'])
        deadline = time.monotonic() + 5
        while len(served) < 1 and time.monotonic() < deadline:  # the server's thread ends its answer
            time.sleep(0.01)
        served.clear()
        with open_for_scan(shard) as f:  # one 16 MiB block: the whole file, asked for and read once
            assert [(m.offset_data, m.size) for m in tarfile.open(fileobj=f, mode='r:')] == shards['members']['s0.tar']
        assert served == [size]  # one GET (and the HEAD of its size)
        with pytest.raises(RangesNotSupportedError), open_for_scan(shard, block_bytes=4096) as f:
            list(tarfile.open(fileobj=f, mode='r:'))


def test_a_server_with_ranges_serves_each_byte_of_a_shard_once(shards, srv, tmp_path):
    read_every_member(shards, srv, tmp_path, 's1.tar')
    assert srv.bytes_sent == len(shards['data']['s1.tar'])
    assert all(r.range is not None for r in srv.log)


def test_an_outage_past_the_old_tries_is_ridden_out_with_one_log_line_per_wait(shards, srv, tmp_path, monkeypatch):
    """The server is down (connections dropped), then answers 503, for 1.5 s. At a tenth of the default
    back-off (0.05 s, doubling), 4 tries end after 0.35 s of waiting, and a retry_timeout of 0.3 s ends it
    too; a retry_timeout of 5 s rides it out, and the reader logs once per wait however many samples it
    reads."""
    logged = []
    monkeypatch.setattr(remote, 'print_log', lambda message, **kwargs: logged.append(message))
    url, members = srv.url + '/s0.tar', shards['members']['s0.tar']
    fp = fingerprint(url)
    quick = dict(backoff_s=0.05, max_backoff_s=0.4, readahead_chunks=0)
    for name, settings in (('tries', dict(retries=3)), ('timeout', dict(retry_timeout=0.3))):
        srv.outage(1.5, 'drop')
        with remote_reader(tmp_path / name, **quick, **settings) as reader, pytest.raises(ShardUnavailableError):
            reader.read(url, 0, 100, fp)
    srv.outage(1.5, 503)
    srv.reset_counts()
    logged.clear()
    start = time.monotonic()
    with remote_reader(tmp_path / 'ridden', retry_timeout=5, **quick) as reader:
        got = [reader.read(url, off, n, fp) for off, n in members]
    assert got == [shards['data']['s0.tar'][o:o + n] for o, n in members]
    assert time.monotonic() - start >= 1.4
    assert len(logged) == srv.requests - math.ceil(len(shards['data']['s0.tar']) / CHUNK) > 2
    assert all(url in line and 'retry_timeout=5' in line for line in logged)


@pytest.mark.parametrize('status', [401, 403, 404, 410])
def test_errors_that_cannot_heal_fail_at_once(shards, srv, tmp_path, status):
    url = srv.url + '/s0.tar'
    fp = fingerprint(url)
    srv.reset_counts()
    srv.inject_faults([status])
    with remote_reader(tmp_path, backoff_s=30) as reader, pytest.raises(ShardReadError) as err:
        reader.read(url, 0, 100, fp)
    assert srv.requests == 1 and err.value.url == url and not isinstance(err.value, ShardUnavailableError)


def test_hf_hub_unreachable_without_a_cached_copy_names_the_download_command(hf_cache, tmp_path, monkeypatch):
    monkeypatch.delenv('HF_HUB_OFFLINE')
    monkeypatch.setenv('HF_ENDPOINT', f'http://127.0.0.1:{free_port()}')  # nothing listens there
    with remote_reader(tmp_path, retries=0) as reader, pytest.raises(HubOfflineError) as err:
        reader.read('hf://datasets/org/other-wds/x.tar', 0, 512, {'size': 1024, 'sha256': 'f' * 64})
    assert 'cannot be reached' in str(err.value) and 'huggingface-cli download org/other-wds' in str(err.value)


def test_hf_files_not_in_the_cache_are_read_in_ranges_from_the_hub(shards, tmp_path, monkeypatch, loopback):
    """A stand-in hub on 127.0.0.1 (HF_ENDPOINT) serves the file at its resolve URL: one ranged GET per
    chunk."""
    served = tmp_path / 'hub-site' / 'datasets' / 'org' / 'live-wds' / 'resolve' / 'main' / 'train'
    served.mkdir(parents=True)
    shutil.copy(osp.join(shards['root'], 's0.tar'), served / 's0.tar')
    monkeypatch.setenv('HF_HUB_CACHE', str(tmp_path / 'empty-cache'))
    monkeypatch.delenv('HF_HUB_OFFLINE', raising=False)
    data, members = shards['data']['s0.tar'], shards['members']['s0.tar']
    fp = {'size': len(data), 'sha256': hashlib.sha256(data).hexdigest()}
    with loopback(str(tmp_path / 'hub-site')) as hub:
        monkeypatch.setenv('HF_ENDPOINT', hub.url)
        with remote_reader(tmp_path) as reader:
            got = [reader.read('hf://datasets/org/live-wds/train/s0.tar', o, n, fp) for o, n in members]
    assert got == [data[o:o + n] for o, n in members]
    assert {(r.method, r.path) for r in hub.log} == {('GET', '/datasets/org/live-wds/resolve/main/train/s0.tar')}
    assert hub.requests == math.ceil(len(data) / CHUNK)
