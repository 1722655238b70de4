"""Building the tar index: reused until a shard changes, never half-written, the same on every core, the heap
frozen only while it runs, workers ended when it fails, every bad shard in one error, counts checked."""
import gc
import gzip
import json
import multiprocessing
import os
import os.path as osp
import signal
import threading
import time

import numpy as np
import pytest

from helpers.tar_index_fixtures import PER_SHARD, open_index, samples, wds  # noqa: F401 (fixtures)
from helpers.tar_shards import NUM_CLASSES, write_wds
from vit_plugin.datasets import tar_index_build, tar_scan
from vit_plugin.datasets.tar_index import LabelRule, TarIndexError, TarShardIndex, resolve_shards


def test_index_is_reused_until_a_shard_changes(wds, samples, monkeypatch):
    first = open_index(wds)
    stamp = os.stat(first.path).st_mtime_ns
    with monkeypatch.context() as patch:
        patch.setattr(tar_index_build, '_build', lambda *args: pytest.fail('an unchanged index was rebuilt'))
        again = open_index(wds)
    assert os.stat(again.path).st_mtime_ns == stamp and again.labels.tolist() == first.labels.tolist()
    changed = [s._replace(label=(s.label + 1) % NUM_CLASSES) for s in samples[7:12]]
    write_wds(wds, list(samples[:7]) + changed + list(samples[12:]), PER_SHARD)
    rebuilt = open_index(wds)
    assert rebuilt.labels[7:12].tolist() == [s.label for s in changed]


def test_a_half_written_index_is_never_used(wds, monkeypatch):
    good = open_index(wds)
    size = os.path.getsize(good.path)
    with open(good.path, 'r+b') as f:
        f.truncate(size - 100)
    assert open_index(wds).labels.tolist() == good.labels.tolist()  # rebuilt, not read short
    os.remove(good.path)

    def failing(task):
        raise TarIndexError('stop in the middle')
    monkeypatch.setattr(tar_index_build, '_run_task', failing)
    with pytest.raises(TarIndexError, match='stop in the middle'):
        open_index(wds)
    left = [n for n in os.listdir(osp.dirname(good.path)) if not n.endswith('.lock')]  # the build's lock file
    assert left == []  # no index, no temporary file


def test_every_core_builds_the_same_index(wds):
    serial = open_index(wds)
    parallel = TarShardIndex.open(resolve_shards(wds, None, 'train'), workers=3, rebuild=True)
    for name in ('offsets', 'sizes', 'labels', 'shard_starts', 'name_offsets', 'names_data'):
        assert np.array_equal(getattr(serial, name), getattr(parallel, name)), name


def test_a_parallel_build_freezes_the_heap_only_while_it_runs(wds):
    """The forked workers share the parent's heap pages while the build runs (gc.freeze); the heap is
    unfrozen when the build ends, and when its consumer stops early."""
    tasks, _ = tar_index_build._tasks(resolve_shards(wds, None, 'train'), 'webdataset', LabelRule())
    assert len(tasks) == 3 and gc.get_freeze_count() == 0
    assert all(gc.get_freeze_count() > 0 for _ in tar_index_build._scans(tasks, workers=2))
    assert gc.get_freeze_count() == 0
    scans = tar_index_build._scans(tasks, workers=2)
    next(scans)
    assert gc.get_freeze_count() > 0
    scans.close()
    assert gc.get_freeze_count() == 0


_SCAN_MARKS = {}  # where the forked workers of the test below mark their start and end (inherited by fork)


def _fail_first_then_work(task):
    if task[0] == 0:  # fails once another worker is scanning
        deadline = time.time() + 10
        while not any(n.startswith('started_') for n in os.listdir(_SCAN_MARKS['folder'])) and time.time() < deadline:
            time.sleep(0.01)
        raise TarIndexError('shard 0: damaged')
    with open(osp.join(_SCAN_MARKS['folder'], f'started_{task[0]}_{os.getpid()}'), 'w'):
        pass
    time.sleep(5)  # still scanning when the build stops
    with open(osp.join(_SCAN_MARKS['folder'], f'finished_{task[0]}'), 'w'):
        pass


def test_a_failed_parallel_build_ends_its_workers_under_a_sigterm_handler(monkeypatch, tmp_path):
    """A training process's pre-emption handler (it only records SIGTERM) is inherited by the forked
    index workers; a build that stops on a damaged shard must still end the one still scanning rather
    than wait for it: the worker that started a scan is gone and never finished it. A watchdog kills the
    build's workers left after 20 s, so that a stalled build fails instead of hanging; children this
    process had before are not the build's and are left alone."""
    others = set(multiprocessing.active_children())  # what this process started before: not the build's

    def build_workers():
        return [child for child in multiprocessing.active_children() if child not in others]

    def kill_workers():
        for child in build_workers():
            child.kill()

    monkeypatch.setattr(tar_index_build, '_run_task', _fail_first_then_work)
    monkeypatch.setitem(_SCAN_MARKS, 'folder', str(tmp_path))
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: None)
    watchdog = threading.Timer(20, kill_workers)
    watchdog.start()
    try:
        with pytest.raises(TarIndexError, match='shard 0'):
            list(tar_index_build._scans([(0,), (1,), (2,)], workers=2))
        assert build_workers() == []
        started = [name for name in os.listdir(tmp_path) if name.startswith('started_')]
        assert started, 'no worker was scanning when the build stopped'
        assert not osp.exists(f'/proc/{started[0].rsplit("_", 1)[1]}')  # ended, not left running
        time.sleep(0.2)
        assert not [name for name in os.listdir(tmp_path) if name.startswith('finished_')]
    finally:
        watchdog.cancel()
        signal.signal(signal.SIGTERM, previous)
        kill_workers()


def _truncate_mid_member(folder):
    path = osp.join(folder, 'imagenet22k-train-0001.tar')
    size = os.path.getsize(path)
    with open(path, 'r+b') as f:
        f.truncate(size // 2)
    return 'imagenet22k-train-0001.tar', 'truncated'


def _gzip_content(folder):
    path = osp.join(folder, 'imagenet22k-train-0002.tar')
    data = open(path, 'rb').read()
    with open(path, 'wb') as f:
        f.write(gzip.compress(data))
    return 'imagenet22k-train-0002.tar', 'decompress it first'


def test_every_bad_shard_is_reported_in_one_error(wds, monkeypatch):
    """Two damaged shards of three, with one process and with two: both named, each with its fault."""
    _truncate_mid_member(wds)
    _gzip_content(wds)
    for workers in (1, 2):
        with pytest.raises(TarIndexError) as err:
            TarShardIndex.open(resolve_shards(wds, 'imagenet22k-train-{0000..0002}.tar', 'train'), workers=workers)
        text = str(err.value)
        assert '2 bad shards' in text, text
        assert 'imagenet22k-train-0001.tar: truncated' in text and 'imagenet22k-train-0002.tar holds gzip' in text
    monkeypatch.setattr(tar_scan, 'MAX_LISTED', 1)
    with pytest.raises(TarIndexError, match='and 1 more') as err:
        open_index(wds, shards='imagenet22k-train-{0000..0002}.tar')
    assert 'imagenet22k-train-0002.tar' not in str(err.value)  # listed in order, up to the limit


def test_a_shard_whose_count_differs_from_the_split_file_is_named(wds):
    info = json.load(open(osp.join(wds, '_info.json')))
    info['splits']['train']['shard_lengths'][1] += 1
    json.dump(info, open(osp.join(wds, '_info.json'), 'w'))
    with pytest.raises(TarIndexError, match='imagenet22k-train-0001.tar: 5 samples, but .*_info.json says 6'):
        open_index(wds)
