"""Byte-level reading of tar shards, local and remote (vit_plugin.datasets.shard_files).

Remote reads go to a loopback HTTP server that the module starts (vit_plugin.benchmarks.loopback_http)
and counts requests on; ``hf://`` is tested offline against a Hugging Face cache laid out in a temporary
folder, and against an endpoint on 127.0.0.1 where nothing listens.
"""
import contextlib
import functools
import gc
import hashlib
import io
import math
import multiprocessing
import os
import os.path as osp
import pickle
import random
import shutil
import tarfile
import threading
import time
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

import pytest

from helpers.common import free_port
from benchmarks.loopback_http import serve_folder
from vit_plugin.datasets import shard_files
from vit_plugin.datasets.shard_files import (HubOfflineError, RangesNotSupportedError, ShardNotFoundError,
                                             ShardReadError, ShardReader, ShardUnavailableError, fingerprint, fingerprints_in_folder, is_remote, join_url, list_folder,
                                             open_for_scan, read_small_file, resolve_hf_url)

CHUNK = 64 << 10  # toy chunks: the shards below span several


def make_tar(path, members, seed):
    """A tar of ``members`` files of random sizes and bytes; returns ``[(offset_data, size)]`` of each."""
    rng = random.Random(seed)
    with tarfile.open(path, 'w', format=tarfile.USTAR_FORMAT) as tar:
        for i in range(members):
            data = rng.randbytes(rng.randint(500, 12000))
            info = tarfile.TarInfo(f'n0000{seed}_{i:04d}.jpg')
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    with tarfile.open(path) as tar:
        return [(m.offset_data, m.size) for m in tar.getmembers()]


@pytest.fixture(scope='module')
def shards(tmp_path_factory):
    """A folder of two shards, a compressed tar, a sub-folder and an info file; the bytes and members."""
    root = tmp_path_factory.mktemp('shards')
    members = {name: make_tar(str(root / name), 60, seed) for seed, name in enumerate(['s0.tar', 's1.tar'])}
    (root / 'old.tar.gz').write_bytes(b'\x1f\x8b not really')
    (root / '_info.json').write_text('{"name": "toy"}')
    (root / 'sub').mkdir()
    (root / 'sub' / 'inner.tar').write_bytes(b'')
    data = {name: (root / name).read_bytes() for name in members}
    return dict(root=str(root), members=members, data=data)


@pytest.fixture(scope='module')
def server(shards):
    with serve_folder(shards['root']) as srv:
        yield srv


@pytest.fixture
def srv(server):
    server.reset_counts()
    return server


def remote_reader(tmp_path, **kwargs):
    settings = dict(cache_dir=str(tmp_path / 'cache'), chunk_bytes=CHUNK, cache_bytes=64 * CHUNK, backoff_s=0.0)
    settings.update(kwargs)
    return ShardReader(**settings)


def chunk_files(folder):
    return sorted(name for _, _, files in os.walk(folder) for name in files
                  if not name.startswith('.') and not name.endswith('.lock'))


# --- URLs ---------------------------------------------------------------------------------------------------

def test_is_remote_tells_fsspec_urls_from_local_paths():
    assert [is_remote(u) for u in ('s3://b/k.tar', 'gs://b/k', 'https://h/x.tar', 'hf://datasets/o/n/x.tar',
                                   'simplecache::s3://b/k')] == [True] * 5
    assert [is_remote(u) for u in ('/data/x.tar', 'rel/x.tar', 'file:///data/x.tar', 'C:\\data\\x.tar')] == [False] * 4


def test_join_url_joins_local_folders_and_urls():
    assert join_url('/data/wds', 'train/s0.tar') == osp.join('/data/wds', 'train', 's0.tar')
    assert join_url('hf://datasets/timm/imagenet-1k-wds/', 'x.tar') == 'hf://datasets/timm/imagenet-1k-wds/x.tar'
    assert join_url('s3://bucket/wds', 'x.tar') == 's3://bucket/wds/x.tar'
    assert join_url('s3://bucket/wds', 'https://mirror/x.tar') == 'https://mirror/x.tar'


# --- local files ----------------------------------------------------------------------------------------------

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


def test_local_read_past_the_end_is_a_truncated_shard_error(shards):
    path = osp.join(shards['root'], 's0.tar')
    size = len(shards['data']['s0.tar'])
    with ShardReader() as reader, pytest.raises(ShardReadError, match='truncated') as err:
        reader.read(path, size - 10, 20)
    assert err.value.url == path


def test_missing_local_shard_is_a_not_found_error(tmp_path):
    with ShardReader() as reader, pytest.raises(ShardNotFoundError, match='not found'):
        reader.read(str(tmp_path / 'nope.tar'), 0, 10)


def test_local_fingerprint_changes_when_the_shard_is_rewritten(tmp_path):
    path = tmp_path / 'x.tar'
    path.write_bytes(b'a' * 100)
    before = fingerprint(str(path))
    path.write_bytes(b'b' * 101)
    assert set(before) == {'size', 'mtime_ns'} and fingerprint(str(path)) != before


# --- remote files over HTTP -------------------------------------------------------------------------------------

def test_remote_random_ranges_are_exact(shards, srv, tmp_path):
    data = shards['data']['s1.tar']
    rng = random.Random(1)
    ranges = [(o, rng.randint(0, 3 * CHUNK)) for o in (rng.randrange(len(data)) for _ in range(40))]
    ranges = [(o, min(n, len(data) - o)) for o, n in ranges] + [(0, len(data)), (len(data), 0)]
    with remote_reader(tmp_path) as reader:
        got = [reader.read(srv.url + '/s1.tar', o, n) for o, n in ranges]
    assert got == [data[o:o + n] for o, n in ranges]


def read_every_member(shards, srv, tmp_path, name):
    """Read each member of shard ``name`` through a remote reader, with the server's counts reset first."""
    url = srv.url + '/' + name
    fp = fingerprint(url)
    srv.reset_counts()
    with remote_reader(tmp_path) as reader:
        for off, n in shards['members'][name]:
            reader.read(url, off, n, fp)


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


# --- servers without ranges, outages ------------------------------------------------------------------------
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
    monkeypatch.setattr(shard_files, 'print_log', lambda message, **kwargs: logged.append(message))
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


def test_listing_a_remote_folder_finds_the_shards_and_the_compressed_tars(srv):
    listing = list_folder(srv.url + '/')
    assert (listing.shards, listing.compressed, srv.requests) == (['s0.tar', 's1.tar'], ['old.tar.gz'], 1)


def test_remote_fingerprints_of_a_folder_equal_those_of_each_file(srv):
    found = fingerprints_in_folder(srv.url)
    assert found == {name: fingerprint(f'{srv.url}/{name}') for name in ('s0.tar', 's1.tar')}
    assert found['s0.tar']['ETag'] != found['s1.tar']['ETag']


def test_scanning_a_remote_tar_costs_one_request_per_block(shards, srv):
    block = 128 << 10
    with open_for_scan(srv.url + '/s0.tar', block_bytes=block) as f, tarfile.open(fileobj=f, mode='r:') as tar:
        scanned = [(m.offset_data, m.size) for m in tar]
    assert scanned == shards['members']['s0.tar']
    assert srv.requests <= math.ceil(len(shards['data']['s0.tar']) / block) + 1  # + the HEAD for the size


def test_small_files_are_read_whole_or_none_when_missing(srv, shards):
    assert read_small_file(srv.url + '/_info.json') == b'{"name": "toy"}'
    assert read_small_file(srv.url + '/info.json') is None
    assert read_small_file(osp.join(shards['root'], 'info.json')) is None


# --- processes -------------------------------------------------------------------------------------------------

def _read_in_child(conn, readers, jobs):
    try:
        conn.send([[r.read(*job) for job in jobs] for r in readers])
    except BaseException as err:  # noqa: BLE001 (sent to the parent, which fails the test with it)
        conn.send(repr(err))
    conn.close()


def run_forked(job_lists, timeout_s=60):
    """Each ``(readers, jobs)`` in a forked child at the same time; what each read (a hang fails the test)."""
    ctx = multiprocessing.get_context('fork')
    pipes, processes = [], []
    for readers, jobs in job_lists:
        parent, child = ctx.Pipe()
        processes.append(ctx.Process(target=_read_in_child, args=(child, readers, jobs)))
        pipes.append(parent)
    for process in processes:
        process.start()
    try:
        got = [pipe.recv() if pipe.poll(timeout_s) else 'no answer: the child hangs' for pipe in pipes]
    finally:
        for process in processes:
            process.join(5)
            if process.is_alive():
                process.kill()
    return got


def test_a_reader_pickles_as_its_settings_and_reads_in_a_forked_child(shards, srv, tmp_path):
    """The parent has read (descriptors open, read-ahead threads running); a forked child reads with the
    reader it inherited and with one unpickled from it."""
    local, url = osp.join(shards['root'], 's1.tar'), srv.url + '/s0.tar'
    reader = remote_reader(tmp_path)
    reader.read(local, 0, 512)
    reader.read(url, 0, 512)
    copy = pickle.loads(pickle.dumps(reader))
    jobs = [(local, *shards['members']['s1.tar'][5]), (url, *shards['members']['s0.tar'][-1])]
    expected = [shards['data']['s1.tar'][o:o + n] for _, o, n in jobs[:1]] + \
               [shards['data']['s0.tar'][o:o + n] for _, o, n in jobs[1:]]
    got = run_forked([([reader, copy], jobs)])
    reader.close()
    assert got == [[expected, expected]] and repr(copy) == repr(reader)


def test_processes_sharing_a_cache_fetch_each_chunk_once(shards, tmp_path):
    """Two processes read the same shard at the same time through one cache folder (over a link with 20 ms
    of latency): the node fetches every chunk once."""
    with serve_folder(shards['root'], delay_s=0.02) as slow:
        url = slow.url + '/s1.tar'
        fp = fingerprint(url)
        slow.reset_counts()
        jobs = [(url, off, n, fp) for off, n in shards['members']['s1.tar']]
        got = run_forked([([remote_reader(tmp_path)], jobs)] * 2)
        expected = [shards['data']['s1.tar'][o:o + n] for _, o, n, _ in jobs]
        assert got == [[expected], [expected]]
        assert slow.requests == math.ceil(len(shards['data']['s1.tar']) / CHUNK)


def test_shard_read_error_survives_pickling():
    err = pickle.loads(pickle.dumps(ShardNotFoundError('s3://b/x.tar', 'not found.')))
    assert (type(err), err.url, err.reason, str(err)) == (ShardNotFoundError, 's3://b/x.tar', 'not found.',
                                                          's3://b/x.tar: not found.')


# --- hf:// ------------------------------------------------------------------------------------------------------

def test_hf_urls_resolve_to_repository_revision_and_path():
    assert resolve_hf_url('hf://datasets/timm/imagenet-22k-wds/train/x-0000.tar') == (
        'dataset', 'timm/imagenet-22k-wds', 'main', 'train/x-0000.tar')
    assert resolve_hf_url('hf://datasets/timm/imagenet-1k-wds@v1.0/x.tar') == (
        'dataset', 'timm/imagenet-1k-wds', 'v1.0', 'x.tar')
    assert resolve_hf_url('hf://datasets/org/name@refs%2Fpr%2F3') == ('dataset', 'org/name', 'refs/pr/3', '')
    assert resolve_hf_url('hf://datasets/org/name@refs/pr/3/a/b.tar') == ('dataset', 'org/name', 'refs/pr/3',
                                                                          'a/b.tar')
    assert resolve_hf_url('hf://google/vit-base-patch16-224/model.safetensors') == (
        'model', 'google/vit-base-patch16-224', 'main', 'model.safetensors')
    with pytest.raises(ValueError, match='hf://datasets/<org>/<name>'):
        resolve_hf_url('hf://datasets/lonely')


@pytest.fixture
def hf_cache(shards, tmp_path, monkeypatch):
    """A Hugging Face cache holding ``org/toy-wds`` (dataset) at one commit: ``train/s0.tar`` and
    ``_info.json``, laid out as huggingface_hub writes it (blobs named by their sha256 or git blob id,
    snapshot files linking to them); HF_HUB_OFFLINE=1."""
    hub = tmp_path / 'hub'
    repo = hub / 'datasets--org--toy-wds'
    commit = 'c' * 40
    (repo / 'refs').mkdir(parents=True)
    (repo / 'refs' / 'main').write_text(commit)
    (repo / 'blobs').mkdir()
    (repo / 'snapshots' / commit / 'train').mkdir(parents=True)
    sha = hashlib.sha256(shards['data']['s0.tar']).hexdigest()
    (repo / 'blobs' / sha).write_bytes(shards['data']['s0.tar'])
    os.symlink(f'../../../blobs/{sha}', repo / 'snapshots' / commit / 'train' / 's0.tar')
    blob_id = '1' * 40
    (repo / 'blobs' / blob_id).write_text('{"split": "train"}')
    os.symlink(f'../../blobs/{blob_id}', repo / 'snapshots' / commit / '_info.json')
    monkeypatch.setenv('HF_HUB_CACHE', str(hub))
    monkeypatch.setenv('HF_HUB_OFFLINE', '1')
    return dict(sha=sha, blob_id=blob_id)


def test_hf_offline_reads_come_from_the_cache(shards, hf_cache, tmp_path):
    url = 'hf://datasets/org/toy-wds/train/s0.tar'
    with remote_reader(tmp_path) as reader:
        got = [reader.read(url, off, n) for off, n in shards['members']['s0.tar']]
    assert got == [shards['data']['s0.tar'][o:o + n] for o, n in shards['members']['s0.tar']]


def test_hf_offline_fingerprint_is_the_hubs_lfs_sha256(shards, hf_cache):
    assert fingerprint('hf://datasets/org/toy-wds/train/s0.tar') == {'size': len(shards['data']['s0.tar']),
                                                                     'sha256': hf_cache['sha']}


def test_hf_offline_listing_and_small_files_come_from_the_cache(hf_cache):
    assert list_folder('hf://datasets/org/toy-wds/train').shards == ['s0.tar']
    assert read_small_file('hf://datasets/org/toy-wds/_info.json') == b'{"split": "train"}'
    assert read_small_file('hf://datasets/org/toy-wds/info.json') is None


def test_hf_offline_without_the_repository_names_it_and_the_download_command(hf_cache, tmp_path):
    with remote_reader(tmp_path) as reader, pytest.raises(HubOfflineError) as err:
        reader.read('hf://datasets/timm/imagenet-22k-wds/imagenet22k-train-0000.tar', 0, 512)
    message = str(err.value)
    assert 'HF_HUB_OFFLINE' in message
    assert ('huggingface-cli download timm/imagenet-22k-wds --repo-type dataset --local-dir DIR' in message
            and 'data_root' in message)


def test_hf_hub_unreachable_without_a_cached_copy_names_the_download_command(hf_cache, tmp_path, monkeypatch):
    monkeypatch.delenv('HF_HUB_OFFLINE')
    monkeypatch.setenv('HF_ENDPOINT', f'http://127.0.0.1:{free_port()}')  # nothing listens there
    with remote_reader(tmp_path, retries=0) as reader, pytest.raises(HubOfflineError) as err:
        reader.read('hf://datasets/org/other-wds/x.tar', 0, 512, {'size': 1024, 'sha256': 'f' * 64})
    assert 'cannot be reached' in str(err.value) and 'huggingface-cli download org/other-wds' in str(err.value)


def test_hf_files_not_in_the_cache_are_read_in_ranges_from_the_hub(shards, tmp_path, monkeypatch):
    """A stand-in hub on 127.0.0.1 (HF_ENDPOINT) serves the file at its resolve URL: one ranged GET per
    chunk."""
    served = tmp_path / 'hub-site' / 'datasets' / 'org' / 'live-wds' / 'resolve' / 'main' / 'train'
    served.mkdir(parents=True)
    shutil.copy(osp.join(shards['root'], 's0.tar'), served / 's0.tar')
    monkeypatch.setenv('HF_HUB_CACHE', str(tmp_path / 'empty-cache'))
    monkeypatch.delenv('HF_HUB_OFFLINE', raising=False)
    data, members = shards['data']['s0.tar'], shards['members']['s0.tar']
    fp = {'size': len(data), 'sha256': hashlib.sha256(data).hexdigest()}
    with serve_folder(str(tmp_path / 'hub-site')) as hub:
        monkeypatch.setenv('HF_ENDPOINT', hub.url)
        with remote_reader(tmp_path) as reader:
            got = [reader.read('hf://datasets/org/live-wds/train/s0.tar', o, n, fp) for o, n in members]
    assert got == [data[o:o + n] for o, n in members]
    assert {(r.method, r.path) for r in hub.log} == {('GET', '/datasets/org/live-wds/resolve/main/train/s0.tar')}
    assert hub.requests == math.ceil(len(data) / CHUNK)


def test_module_names_are_exported_by_the_package():
    import vit_plugin.datasets as datasets
    assert all(getattr(datasets, name) is getattr(shard_files, name)
               for name in ('ShardReader', 'ShardReadError', 'fingerprint', 'open_for_scan', 'list_shards_in_folder'))


def test_a_forked_child_leaves_the_parents_connections_alone(shards, srv):
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
