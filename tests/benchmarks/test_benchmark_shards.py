"""tools/analysis/benchmark_shards.py: its images in both layouts, and a run at a toy size (a run of the
tool, not a measurement)."""
import json
import os.path as osp
import tarfile

import pytest
from mmengine.config import Config

from helpers.common import REPO
from benchmarks import benchmark_shards as bench

NUM_IMAGES = 18


@pytest.fixture(scope='module')
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp('shards_bench')
    out = root / 'shards.json'
    result = bench.main(['--data-dir', str(root / 'data'), '--num-images', str(NUM_IMAGES), '--long-side', '64',
                         '--num-classes', '5', '--shard-size', '8', '--samples', str(NUM_IMAGES), '--rounds', '2',
                         '--warmup', '0', '--block-size', '4', '--mix-blocks', '2', '--delay-ms', '5',
                         '--index-samples', '400', '--index-shards', '4', '--out', str(out)])
    return dict(result=result, saved=json.loads(out.read_text()), data=root / 'data')


def test_the_pipeline_is_the_imagenet21k_configs():
    cfg = Config.fromfile(osp.join(REPO, 'configs', '_base_', 'datasets', 'imagenet21k.py'))
    assert [dict(t) for t in bench.PIPELINE] == cfg.train_pipeline


def test_the_shards_hold_the_folders_images_in_timms_layout(run):
    data = run['data']
    lines = (data / 'folder' / bench.LIST_FILE).read_text().splitlines()
    folder = {osp.basename(rel).rsplit('.', 1)[0]: (int(label), (data / 'folder' / 'train' / rel).read_bytes())
              for rel, label in (line.split() for line in lines)}
    info = json.loads((data / 'shards' / '_info.json').read_text())['splits']['train']
    assert info['shard_lengths'] == [8, 8, 2] and info['num_samples'] == NUM_IMAGES
    seen = {}
    for name in info['filenames']:
        with tarfile.open(data / 'shards' / name) as tf:
            members = {m.name: tf.extractfile(m).read() for m in tf}
        keys = {n.split('.')[0] for n in members}
        assert set(members) == {f'{k}.{e}' for k in keys for e in ('jpg', 'cls', 'json')}
        for key in keys:
            meta = json.loads(members[key + '.json'])
            seen[key] = (int(members[key + '.cls']), members[key + '.jpg'])
            assert meta['label'] == seen[key][0] and meta['class_name'] == key.split('_')[0]
    assert seen == folder


def test_every_reader_reads_as_many_samples_with_the_same_labels_as_the_data(run):
    labels = json.loads((run['data'] / 'spec.json').read_text())['labels']
    read = run['saved']['read']
    assert set(read) == set(bench.READERS)
    for passes in read.values():
        assert passes == [[NUM_IMAGES, sum(labels)]] * 2  # (count, label sum) of each round


def test_the_table_pairs_every_reader_with_its_peers(run):
    rows = run['saved']['readers']
    assert all(len(r['times_s']) == 2 and r['samples_per_s'] > 0 for r in rows.values())
    assert set(rows['shards']) >= {'vs_folder', 'vs_webdataset'} and 'vs_shards' in rows['remote']
    assert [t.split(' = ')[0] for t in run['saved']['targets']] == ['shards / folder', 'remote / shards']


def test_the_remote_reader_starts_every_pass_cold_and_fetches_whole_chunks(run):
    setting = run['saved']['setting']
    assert setting['url'].startswith('http://127.0.0.1:')
    shards = sorted((run['data'] / 'shards').glob('*.tar'))
    # Each toy shard is smaller than one 16 MiB chunk: one request per shard and pass, the whole file.
    assert setting['remote_fetched'] == [[len(shards), sum(p.stat().st_size for p in shards)]] * 2


def test_the_index_builds_report_time_and_memory(run):
    rows = run['saved']['index']
    every = rows[0]['workers']
    assert [(r['set'], r['shards'], r['samples'], r['workers']) for r in rows] == [
        ('tiny', 2, 200, every), ('tiny', 4, 400, every), ('tiny', 2, 200, 1), ('tiny', 4, 400, 1),
        ('images', 3, NUM_IMAGES, every)]
    assert all(r['seconds'] > 0 and r['index_bytes'] > 0 and r['peak_added_mib'] >= 0 for r in rows)
    assert [r['worker_processes'] for r in rows[2:4]] == [0, 0]  # one process builds alone
    assert set(run['saved']['index_per_million']) == {str(every), '1'}


def test_per_million_is_the_line_through_both_sizes():
    def row(samples, seconds, memory):
        return dict(set='tiny', workers=2, samples=samples, seconds=seconds, builder_peak_growth_mib=memory,
                    peak_added_mib=2 * memory, index_bytes=50 * samples)
    line = bench.per_million([row(100_000, 3.0, 10.0), row(200_000, 5.0, 10.0)])[2]
    assert line['seconds'] == pytest.approx(dict(per_million=20.0, fixed=1.0))
    assert line['builder_peak_growth_mib'] == pytest.approx(dict(per_million=0.0, fixed=10.0))
    assert line['index_bytes'] == pytest.approx(dict(per_million=50e6, fixed=0.0))


def test_the_extrapolation_is_printed_only_where_its_fit_means_something(run):
    def line(per_million, fixed):
        return dict(seconds=dict(per_million=per_million, fixed=fixed))
    assert bench.fit_problems({4: line(5.0, 0.3), 1: line(18.0, 0.1)}) == []
    assert bench.fit_problems({4: line(5.0, -0.2), 1: line(-1.0, 0.1)}) == [
        '4 processes: a negative fixed cost (-0.20 s)', '1 processes: -1.00 s per million (not positive)',
        '4 processes are no faster per million samples than 1']
    assert bench.fit_problems({2: line(20.0, 0.1), 1: line(18.0, 0.1)}) == [
        '2 processes are no faster per million samples than 1']
    # the toy run's report says which it is
    assert run['saved']['index_fit_problems'] == bench.fit_problems(
        {int(k): v for k, v in run['saved']['index_per_million'].items()})


def test_ratios_are_medians_of_per_round_ratios():
    rows = bench.summarise_readers({'folder': [2.0, 1.0, 4.0], 'shards': [1.0, 1.0, 1.0]}, samples=100)
    assert rows['shards']['vs_folder'] == 2.0  # rounds: 2, 1, 4 -> median 2 (the ratio of medians is 2 too)
    assert rows['folder']['vs_shards'] == 0.5 and rows['shards']['samples_per_s'] == 100.0


def test_the_index_scale_mode_fits_a_cost_per_shard_local_and_remote(tmp_path):
    result = bench.main(['--data-dir', str(tmp_path), '--index-scale', '1', '3', '--scale-samples', '4',
                         '--scale-member-kib', '1', '--delay-ms', '0'])
    assert [(r['where'], r['shards']) for r in result['rows']] == [
        (where, n) for n in (1, 3) for where in ('local', 'remote', 'remote, kept in the cache')]
    sent = {(r['where'], r['shards']): r['mib_sent'] for r in result['rows']}
    assert sent[('remote', 3)] >= 3 * result['shard_mib'] > 0  # a remote scan moves the whole shards
    assert sent[('local', 3)] == 0
    assert set(result['fits']) == {'local', 'remote', 'remote, kept in the cache'}
