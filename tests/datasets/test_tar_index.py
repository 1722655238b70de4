"""The tar-shard index: timm's WebDataset shards and image-net.org's tar of tars, indexed without
extracting, checked against the bytes and labels the tests wrote; bad input named before training."""
import bz2
import gc
import gzip
import json
import lzma
import multiprocessing
import os
import os.path as osp
import re
import shutil
import signal
import subprocess
import tarfile
import tempfile
import threading
import time

import numpy as np
import pytest

from helpers.tar_shards import NUM_CLASSES, add_member, make_samples, toy_synsets, write_tar_of_tars, write_wds
from vit_plugin import label_spaces
from vit_plugin.datasets import tar_index_build, tar_scan
from vit_plugin.datasets.tar_index import LabelRule, TarIndexError, TarShardIndex, expand_braces, resolve_shards

PER_SHARD = (7, 5, 9)


@pytest.fixture(scope='module')
def samples():
    return make_samples(sum(PER_SHARD), seed=1)


@pytest.fixture
def wds(tmp_path, samples):
    folder = str(tmp_path / 'wds')
    write_wds(folder, samples, PER_SHARD)
    return folder


def open_index(folder, rule=LabelRule(), split='train', shards=None, **kwargs):
    return TarShardIndex.open(resolve_shards(folder, shards, split), rule=rule, split=split, workers=1, **kwargs)


def read_image(index, row):
    with open(index.shard_url(index.shard_of(row)), 'rb') as f:
        f.seek(int(index.offsets[row]))
        return f.read(int(index.sizes[row]))


def test_timm_layout_gives_every_sample_its_bytes_and_label(wds, samples):
    index = open_index(wds)
    assert len(index) == len(samples)
    assert [index.key(i) for i in range(len(index))] == [s.key for s in samples]
    assert index.labels.tolist() == [s.label for s in samples]
    assert all(read_image(index, i) == s.jpg for i, s in enumerate(samples))
    assert index.shard_starts.tolist() == [0, 7, 12, 21]
    assert index.location(8) == f'{wds}/imagenet22k-train-0001.tar:{samples[8].key}.jpg'


@pytest.mark.parametrize('rule', [LabelRule('json', 'label'),
                                  LabelRule('synset', synsets=tuple(label_spaces.synsets('fall11'))),
                                  LabelRule('synset')], ids=['json', 'synset-fall11', 'synset-from-data'])
def test_json_and_synset_labels_agree_with_cls(wds, samples, rule):
    index = open_index(wds, rule)
    assert index.labels.tolist() == [s.label for s in samples]  # toy classes are fall11's first synsets
    assert index.synsets == (None if rule.synsets or rule.source != 'synset' else tuple(toy_synsets()))


def test_tar_of_tars_numbers_the_inner_tars_synsets(tmp_path, samples):
    path = str(tmp_path / 'train_whole.tar')
    keys = write_tar_of_tars(path, samples)
    shards = resolve_shards(str(tmp_path), 'train_whole.tar')
    index = TarShardIndex.open(shards, layout='tar_of_tars', rule=LabelRule('synset'), workers=2)
    order = [k for synset in keys for k in keys[synset]]
    assert [index.key(i) for i in range(len(index))] == order
    by_key = {s.key: s for s in samples}
    assert index.labels.tolist() == [sorted(keys).index(by_key[k].synset) for k in order]
    assert all(read_image(index, i) == by_key[k].jpg for i, k in enumerate(order))
    assert index.member(0) == f'{sorted(keys)[0]}.tar/{order[0]}.JPEG'


def test_brace_patterns_expand_as_braceexpand_does():
    braceexpand = pytest.importorskip('braceexpand').braceexpand  # webdataset's own dependency
    for pattern in ('a-{0000..0011}.tar', 'x{1..3}-{a,b}.tar', 'train-{7..10}.tar', 'plain.tar', '{09..11}'):
        assert expand_braces(pattern) == list(braceexpand(pattern))


def test_shards_by_pattern_list_folder_and_split_file(wds):
    names = ('imagenet22k-train-0000.tar', 'imagenet22k-train-0001.tar', 'imagenet22k-train-0002.tar')
    assert resolve_shards(wds, 'imagenet22k-train-{0000..0002}.tar', 'train').names == names
    assert resolve_shards(wds, list(names[:2]), None).names == names[:2]
    from_info = resolve_shards(wds, None, 'train')
    assert from_info.names == names and from_info.counts == PER_SHARD
    os.remove(osp.join(wds, '_info.json'))
    listed = resolve_shards(wds, None, 'train')
    assert listed.names == names and listed.counts is None
    with pytest.raises(TarIndexError, match="no .tar shard with '-validation-'"):
        resolve_shards(wds, None, 'validation')


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
    than wait for it: the worker that started a scan is gone and never finished it. A watchdog kills
    workers left after 20 s, so that a stalled build fails instead of hanging."""
    def kill_workers():
        for child in multiprocessing.active_children():
            child.kill()

    monkeypatch.setattr(tar_index_build, '_run_task', _fail_first_then_work)
    monkeypatch.setitem(_SCAN_MARKS, 'folder', str(tmp_path))
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: None)
    watchdog = threading.Timer(20, kill_workers)
    watchdog.start()
    try:
        with pytest.raises(TarIndexError, match='shard 0'):
            list(tar_index_build._scans([(0,), (1,), (2,)], workers=2))
        assert multiprocessing.active_children() == []
        started = [name for name in os.listdir(tmp_path) if name.startswith('started_')]
        assert started, 'no worker was scanning when the build stopped'
        assert not osp.exists(f'/proc/{started[0].rsplit("_", 1)[1]}')  # ended, not left running
        time.sleep(0.2)
        assert not [name for name in os.listdir(tmp_path) if name.startswith('finished_')]
    finally:
        watchdog.cancel()
        signal.signal(signal.SIGTERM, previous)
        kill_workers()

# --------------------------------------------------------------------------------------- bad input
def _truncate_mid_member(folder):
    path = osp.join(folder, 'imagenet22k-train-0001.tar')
    size = os.path.getsize(path)
    with open(path, 'r+b') as f:
        f.truncate(size // 2)
    return 'imagenet22k-train-0001.tar', 'truncated'


def _truncate_at_member_end(folder):
    path = osp.join(folder, 'imagenet22k-train-0001.tar')
    with open(path, 'r+b') as f:
        f.truncate(os.path.getsize(path) - 1024 * 10)  # drops the end-of-archive blocks and padding
    return 'imagenet22k-train-0001.tar', 'truncated'


def _gzip_content(folder):
    path = osp.join(folder, 'imagenet22k-train-0002.tar')
    data = open(path, 'rb').read()
    with open(path, 'wb') as f:
        f.write(gzip.compress(data))
    return 'imagenet22k-train-0002.tar', 'decompress it first'


def _missing(folder):
    os.remove(osp.join(folder, 'imagenet22k-train-0002.tar'))
    return 'imagenet22k-train-0002.tar', 'missing or unreadable'


def _a_folder(folder):
    path = osp.join(folder, 'imagenet22k-train-0000.tar')
    os.remove(path)
    os.mkdir(path)
    return 'imagenet22k-train-0000.tar', 'cannot be read'


BAD = {'truncated-mid-member': _truncate_mid_member, 'truncated-between-members': _truncate_at_member_end,
       'gzip': _gzip_content, 'missing': _missing, 'not-a-file': _a_folder}


@pytest.mark.parametrize('damage', sorted(BAD))
def test_a_damaged_shard_is_named_before_training(wds, damage):
    shard, reason = BAD[damage](wds)
    with pytest.raises(TarIndexError) as err:
        open_index(wds, LabelRule('cls'), shards='imagenet22k-train-{0000..0002}.tar')
    assert shard in str(err.value) and reason in str(err.value)
    folder = osp.join(wds, '.vit_plugin_index')  # no index; the good shards' scans are kept for the next build
    assert not osp.exists(folder) or not any(n.endswith('.index') for n in os.listdir(folder))


def suggested_commands(message):
    """The shell commands an error message gives (between backquotes)."""
    return re.findall(r'`([^`]+)`', message)


def run_commands(message, cwd):
    commands = suggested_commands(message)
    assert commands, message
    for command in commands:
        subprocess.run(['bash', '-c', command], cwd=cwd, check=True, capture_output=True)


COMPRESSORS = {'gzip': ('.tar.gz', gzip.compress), 'bzip2': ('.tar.bz2', bz2.compress),
               'xz': ('.tar.xz', lzma.compress), 'zstd': ('.tar.zst', None)}


def compress(tool, data, path):
    if COMPRESSORS[tool][1] is not None:
        open(path, 'wb').write(COMPRESSORS[tool][1](data))
    else:
        subprocess.run([tool, '-q', '-f', '-o', path], input=data, check=True)


@pytest.mark.parametrize('tool', sorted(COMPRESSORS))
def test_a_compressed_shard_names_a_command_that_gives_the_tar(wds, tool):
    """Named as a compressed tar, or a .tar holding compressed bytes: the command in the error runs on the
    error's own file and leaves the .tar that then indexes."""
    if shutil.which(tool) is None:
        pytest.skip(f'{tool} is not installed')
    good = open_index(wds).labels.tolist()
    name = 'imagenet22k-train-0001.tar'
    path = osp.join(wds, name)
    data = open(path, 'rb').read()
    suffix = COMPRESSORS[tool][0]
    packed = path[:-len('.tar')] + suffix
    compress(tool, data, packed)
    os.remove(path)
    with pytest.raises(TarIndexError, match='decompress it first') as err:
        resolve_shards(wds, ['imagenet22k-train-0000.tar', name[:-len('.tar')] + suffix, 'imagenet22k-train-0002.tar'])
    run_commands(str(err.value), tempfile.mkdtemp(dir=wds))
    assert open(path, 'rb').read() == data and open_index(wds).labels.tolist() == good
    compress(tool, data, path)  # compressed bytes under the .tar name
    with pytest.raises(TarIndexError, match=f'{tool}-compressed data under a .tar name') as err:
        open_index(wds)
    run_commands(str(err.value), tempfile.mkdtemp(dir=wds))
    assert open(path, 'rb').read() == data and open_index(wds).labels.tolist() == good


def test_a_folder_of_compressed_tars_names_a_command(tmp_path, samples):
    folder = str(tmp_path / 'packed')
    names = write_wds(folder, samples[:6], (6,), info=False)
    path = osp.join(folder, names[0])
    data = open(path, 'rb').read()
    open(path + '.gz', 'wb').write(gzip.compress(data))
    os.remove(path)
    with pytest.raises(TarIndexError, match='compressed tars.*decompress them first') as err:
        resolve_shards(folder, None, None)
    run_commands(str(err.value), str(tmp_path))
    assert open(path, 'rb').read() == data and len(open_index(folder, split=None)) == 6


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


@pytest.mark.parametrize('members, rule, expect', [
    (('cls', 'json'), LabelRule('cls'), 'no image member'),
    (('jpg', 'json'), LabelRule('cls'), "no 'cls' member"),
    (('jpg', 'cls'), LabelRule('json'), "no 'json' member"),
])
def test_a_sample_without_image_or_label_stops_the_build(tmp_path, samples, members, rule, expect):
    folder = str(tmp_path / 'bad')
    write_wds(folder, samples[:4], (4,), members=members, info=False)
    with pytest.raises(TarIndexError, match=expect) as err:
        open_index(folder, rule)
    assert 'imagenet22k-train-0000.tar' in str(err.value) and samples[0].key in str(err.value)


def test_a_label_out_of_range_is_named(tmp_path, samples):
    folder = str(tmp_path / 'labels')
    bad = list(samples[:6])
    bad[3] = bad[3]._replace(label=NUM_CLASSES + 4)
    write_wds(folder, bad, (6,), info=False)
    with pytest.raises(TarIndexError) as err:
        open_index(folder, num_classes=NUM_CLASSES)
    assert f'{bad[3].key}.jpg' in str(err.value) and f'label {NUM_CLASSES + 4} is outside' in str(err.value)


def test_a_label_that_is_not_a_number_is_named(tmp_path, samples):
    folder = tmp_path / 'text'
    folder.mkdir()
    with tarfile.open(folder / 'imagenet22k-train-0000.tar', 'w') as tf:
        add_member(tf, samples[0].key + '.jpg', samples[0].jpg)
        add_member(tf, samples[0].key + '.cls', b'tench')
    with pytest.raises(TarIndexError, match=f"sample '{samples[0].key}': the cls 'tench' is not an integer label"):
        open_index(str(folder))


def test_a_synset_outside_the_label_space_is_named(wds, samples):
    with pytest.raises(TarIndexError) as err:
        open_index(wds, LabelRule('synset', synsets=tuple(label_spaces.synsets('fall11')[3:])))
    first = next(s for s in samples if s.label < 3)
    assert first.synset in str(err.value) and 'not in the label space' in str(err.value)


def test_a_shard_whose_count_differs_from_the_split_file_is_named(wds):
    info = json.load(open(osp.join(wds, '_info.json')))
    info['splits']['train']['shard_lengths'][1] += 1
    json.dump(info, open(osp.join(wds, '_info.json'), 'w'))
    with pytest.raises(TarIndexError, match='imagenet22k-train-0001.tar: 5 samples, but .*_info.json says 6'):
        open_index(wds)
