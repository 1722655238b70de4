"""vit_plugin.datasets.shards.reader: ShardReader's exact ranges, remote and hf://, its pickling and its
reads in forked children."""
import os.path as osp
import pickle
import random

import pytest

from helpers.toy_shards import CHUNK, remote_reader, run_forked
from vit_plugin.datasets.shards.errors import HubOfflineError
from vit_plugin.datasets.shards.reader import ShardReader


def test_settings_that_cannot_work_are_refused():
    for settings in (dict(chunk_bytes=0), dict(retry_timeout=-1), dict(cache_bytes=CHUNK, chunk_bytes=CHUNK)):
        with pytest.raises(ValueError, match='ShardReader'):
            ShardReader(**settings)


def test_remote_random_ranges_are_exact(shards, srv, tmp_path):
    data = shards['data']['s1.tar']
    rng = random.Random(1)
    ranges = [(o, rng.randint(0, 3 * CHUNK)) for o in (rng.randrange(len(data)) for _ in range(40))]
    ranges = [(o, min(n, len(data) - o)) for o, n in ranges] + [(0, len(data)), (len(data), 0)]
    with remote_reader(tmp_path) as reader:
        got = [reader.read(srv.url + '/s1.tar', o, n) for o, n in ranges]
    assert got == [data[o:o + n] for o, n in ranges]


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


def test_hf_offline_reads_come_from_the_cache(shards, hf_cache, tmp_path):
    url = 'hf://datasets/org/toy-wds/train/s0.tar'
    with remote_reader(tmp_path) as reader:
        got = [reader.read(url, off, n) for off, n in shards['members']['s0.tar']]
    assert got == [shards['data']['s0.tar'][o:o + n] for o, n in shards['members']['s0.tar']]


def test_hf_offline_without_the_repository_names_it_and_the_download_command(hf_cache, tmp_path):
    with remote_reader(tmp_path) as reader, pytest.raises(HubOfflineError) as err:
        reader.read('hf://datasets/timm/imagenet-22k-wds/imagenet22k-train-0000.tar', 0, 512)
    message = str(err.value)
    assert 'HF_HUB_OFFLINE' in message
    assert ('huggingface-cli download timm/imagenet-22k-wds --repo-type dataset --local-dir DIR' in message
            and 'data_root' in message)
