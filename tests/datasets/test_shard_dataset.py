"""vit_plugin.TarShardDataset: the pipeline of a config decodes images from tar shards exactly as from
files; every key once per epoch with its label on 1-3 processes and 0 or 2 workers; shards over HTTP;
hf:// offline; damage found mid-run named, or counted under the skip policy."""
import itertools
import os
import os.path as osp
import pickle

import numpy as np
import pytest
from mmcv.transforms import Compose
from torch.utils.data import DataLoader

from helpers.tar_shards import NUM_CLASSES, make_samples, write_tar_of_tars, write_wds
from vit_plugin import label_spaces
from benchmarks.loopback_http import serve_folder
from vit_plugin.datasets import BlockShuffleSampler, SkipBadSamples, TarShardDataset
from vit_plugin.datasets.shard_dataset import SampleReadError
from vit_plugin.datasets.shards import ShardReadError
from vit_plugin.datasets.tar_index import TarIndexError

PER_SHARD = (9, 6, 8, 7)
CROP = [dict(type='vit_plugin.LoadAndInceptionCrop', scale=16, crop_ratio_range=(0.05, 1.0)),
        dict(type='mmpretrain.RandomFlip', prob=0.5, direction='horizontal')]
PACK = [dict(type='vit_plugin.LoadImageFromFile'), dict(type='mmpretrain.PackInputs')]


@pytest.fixture(scope='module')
def samples():
    return make_samples(sum(PER_SHARD), seed=2, size=40)


@pytest.fixture(scope='module')
def shards(tmp_path_factory, samples):
    folder = str(tmp_path_factory.mktemp('wds'))
    write_wds(folder, samples, PER_SHARD)
    return folder


def build(root, pipeline=PACK, **kwargs):
    kwargs.setdefault('index_workers', 1)
    kwargs.setdefault('num_classes', NUM_CLASSES)
    return TarShardDataset(root, pipeline=pipeline, **kwargs)


def test_the_pipeline_gives_the_boxes_and_pixels_it_gives_from_files(shards, samples, tmp_path):
    dataset = build(shards, CROP)
    from_files = Compose([dict(t) for t in CROP])
    for i, sample in enumerate(samples):
        path = tmp_path / f'{sample.key}.jpg'
        path.write_bytes(sample.jpg)
        np.random.seed(i)
        expected = from_files({'img_path': str(path)})
        np.random.seed(i)
        got = dataset[i]
        assert np.array_equal(got['img'], expected['img']) and got['flip'] == expected['flip']
        assert got['ori_shape'] == expected['ori_shape'] and got['gt_label'] == sample.label


def keys_and_labels(dataset, rank, world_size, workers):
    sampler = BlockShuffleSampler(dataset, seed=5, block_size=4, mix_blocks=2, infinite=False, rank=rank,
                                  world_size=world_size)
    loader = DataLoader(dataset, batch_size=4, sampler=sampler, num_workers=workers, collate_fn=list)
    return [(osp.basename(d['data_samples'].img_path.rpartition(':')[2]), int(d['data_samples'].gt_label))
            for batch in loader for d in batch]


@pytest.mark.parametrize('workers', [0, 2])
@pytest.mark.parametrize('world_size', [1, 2, 3])
def test_every_key_once_per_epoch_with_its_label(shards, samples, world_size, workers):
    dataset = build(shards)
    shares = [keys_and_labels(dataset, rank, world_size, workers) for rank in range(world_size)]
    seen = list(itertools.chain(*shares))
    expected = {f'{s.key}.jpg': s.label for s in samples}
    assert dict(seen) == expected  # every key, each with its label
    assert len(seen) - len(expected) <= world_size - 1  # DefaultSampler's padding
    assert len({len(share) for share in shares}) == 1
    if workers:  # the order does not depend on the number of workers
        assert shares == [keys_and_labels(dataset, rank, world_size, 0) for rank in range(world_size)]


def test_the_dataset_pickles_as_a_file_name(shards):
    dataset = build(shards)
    blob = pickle.dumps(dataset._index)
    assert dataset._index.path.encode() in blob and dataset._index.offsets.tobytes() not in blob
    again = pickle.loads(pickle.dumps(dataset))
    assert isinstance(again._index.offsets, np.memmap) and again._index.path == dataset._index.path
    assert again.get_data_info(3) == dataset.get_data_info(3)


def test_shards_over_http_give_the_local_samples(shards, tmp_path, monkeypatch):
    monkeypatch.setenv('VIT_PLUGIN_CACHE', str(tmp_path / 'cache'))
    local = build(shards)
    with serve_folder(shards) as server:
        remote = build(server.url, reader=dict(cache_dir=str(tmp_path / 'chunks'), chunk_bytes=1 << 16,
                                               cache_bytes=1 << 20))
        assert len(remote) == len(local)
        for i in range(len(local)):
            got, want = remote[i], local[i]
            assert np.array_equal(got['inputs'].numpy(), want['inputs'].numpy())
            assert int(got['data_samples'].gt_label) == int(want['data_samples'].gt_label)
        # byte ranges of chunks, not a request per image
        gets = [r for r in server.log if r.method == 'GET' and r.path.endswith('.tar')]
        assert len(gets) < len(local) / 2


def test_hf_shards_offline_name_the_repository_and_the_download(tmp_path, monkeypatch):
    monkeypatch.setenv('HF_HUB_OFFLINE', '1')
    monkeypatch.setenv('HF_HUB_CACHE', str(tmp_path / 'hub'))
    monkeypatch.setenv('VIT_PLUGIN_CACHE', str(tmp_path / 'cache'))
    with pytest.raises((ShardReadError, ValueError)) as err:
        build('hf://datasets/timm/imagenet-22k-wds', split='train')
    assert 'timm/imagenet-22k-wds' in str(err.value) and 'huggingface-cli download' in str(err.value)


def test_target_label_space_gives_google_order(shards, samples):
    dataset = build(shards, label_space='fall11', target_label_space='google21k', num_classes=None)
    google = label_spaces.index_map('fall11', 'google21k')
    assert dataset.get_gt_labels().tolist() == [int(google[s.label]) for s in samples]
    assert dataset.metainfo['classes'][:2] == label_spaces.class_names('google21k')[:2]


def test_a_tar_of_tars_serves_its_synsets(tmp_path, samples):
    path = str(tmp_path / 'whole.tar')
    keys = write_tar_of_tars(path, samples)
    dataset = build(str(tmp_path), shards='whole.tar', split=None, layout='tar_of_tars', label_space='fall11')
    by_key = {s.key: s for s in samples}
    order = [k for synset in keys for k in keys[synset]]
    assert [d['key'] for d in map(dataset.get_data_info, range(len(dataset)))] == order
    assert dataset.get_gt_labels().tolist() == [by_key[k].label for k in order]
    assert int(dataset[0]['data_samples'].gt_label) == by_key[order[0]].label


def test_a_shard_damaged_mid_run_is_named_or_counted(tmp_path, samples):
    folder = str(tmp_path / 'damaged')
    write_wds(folder, samples, PER_SHARD)
    dataset = build(folder)
    last = osp.join(folder, 'imagenet22k-train-0003.tar')
    with open(last, 'r+b') as f:
        f.truncate(os.path.getsize(last) // 3)
    row = len(samples) - 1
    with pytest.raises(SampleReadError) as err:
        dataset[row]
    assert f'imagenet22k-train-0003.tar:{samples[row].key}.jpg' in str(err.value)
    skipping = SkipBadSamples(dataset=dataset, max_fraction=0.5)
    replaced = skipping[row]
    records = replaced['data_samples'].metainfo['bad_samples']
    assert records[0][0] == row and samples[row].key in records[0][1]


def test_a_pipeline_that_reads_files_is_refused(shards):
    with pytest.raises(ValueError, match="LoadImageFromFile, which reads files; use dict\\(type='vit_plugin"):
        build(shards, [dict(type='LoadImageFromFile'), dict(type='mmpretrain.PackInputs')])


def test_a_bad_image_gets_the_advice_of_its_source(tmp_path, samples):
    """Bytes that are no image, as a sample of a shard and as an image of a tar of tars: the error names the
    shard and the member, says to fix the shard (or that the archive cannot be edited) or to skip, and never
    speaks of a list; the list-file and folder datasets' advice is tested in test_decode.py."""
    from vit_plugin.datasets.decode import ImageDecodeError
    bad = list(samples[:6])
    bad[2] = bad[2]._replace(jpg=b'<html>no image</html>')
    folder = str(tmp_path / 'wds')
    write_wds(folder, bad, (6,), info=False)
    with pytest.raises(ImageDecodeError) as err:
        build(folder, split=None)[2]
    text = str(err.value)
    assert text.startswith(f'{folder}/imagenet22k-train-0000.tar:{bad[2].key}.jpg: not an image (')
    assert 'write the shard again with this sample replaced or left out' in text and 'SkipBadSamples' in text
    assert 'list' not in text
    keys = write_tar_of_tars(str(tmp_path / 'whole.tar'), bad)
    dataset = build(str(tmp_path), shards='whole.tar', split=None, layout='tar_of_tars', label_space='fall11')
    row = [k for synset in keys for k in keys[synset]].index(bad[2].key)
    with pytest.raises(ImageDecodeError) as err:
        dataset[row]
    text = str(err.value)
    assert f'whole.tar:{bad[2].synset}.tar/{bad[2].key}.JPEG: not an image' in text
    assert 'the archive cannot be edited in place' in text and 'SkipBadSamples' in text and 'list' not in text


def test_the_reader_settings_reach_the_index_build_and_the_reads(shards, tmp_path, monkeypatch):
    """reader=dict(retry_timeout=...) is the retry policy of the remote index build and of every read."""
    monkeypatch.setenv('VIT_PLUGIN_CACHE', str(tmp_path / 'cache'))
    from vit_plugin.datasets import tar_index_build
    seen = []
    scan = tar_index_build.scan_webdataset
    monkeypatch.setattr(tar_index_build, 'scan_webdataset', lambda url, rule, retry=None, keep=None:
                        seen.append(retry) or scan(url, rule, retry, keep))
    with serve_folder(shards) as server:
        dataset = build(server.url, reader=dict(cache_dir=str(tmp_path / 'chunks'), chunk_bytes=1 << 16,
                                                cache_bytes=1 << 20, retry_timeout=42, backoff_s=0.01))
        assert int(dataset[0]['data_samples'].gt_label) >= 0
    assert dataset.reader.retry.timeout_s == 42 and dataset.reader.retry.backoff_s == 0.01
    assert seen == [dataset.reader.retry] * len(PER_SHARD)


def test_a_label_outside_num_classes_names_the_sample(shards, samples):
    first = next(i for i, s in enumerate(samples) if s.label >= 2)
    with pytest.raises(TarIndexError) as err:
        build(shards, num_classes=2)
    text = str(err.value)
    assert text.startswith(f'{shards}/imagenet22k-train-0000.tar:{samples[first].key}.jpg: label '
                           f'{samples[first].label} is outside [0, 2)') and 'Set num_classes' in text
