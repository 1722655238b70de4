"""tools/analysis/benchmark_dataset_index.py: its synthetic ImageNet-21k list file, and a run at a toy size."""
import json
import os
import os.path as osp
import re

import numpy as np
import pytest

from benchmarks import benchmark_dataset_index as bench
from vit_plugin.datasets.compact_index import parse_list_file


def test_synthetic_list_file_looks_like_imagenet21k(tmp_path):
    counts = bench.class_counts(bench.IN21K_IMAGES, bench.IN21K_CLASSES)
    assert counts.sum() == 14_197_122 and len(counts) == 21_841 and counts.min() >= 1
    assert 400 < np.median(counts) < 700 and counts.max() > 3 * np.median(counts)  # long-tailed
    path = bench.write_list_file(str(tmp_path), 30_000, 1_000, seed=0)
    lines = open(path).read().splitlines()
    assert len(lines) == 30_000 and osp.isdir(tmp_path / 'train')
    pattern = re.compile(r'^(n\d{8})/(n\d{8})_\d+\.JPEG (\d+)$')
    labels = []
    for line in lines[::97]:
        m = pattern.match(line)
        assert m and m.group(1) == m.group(2), line
        labels.append(int(m.group(3)))
    assert labels == sorted(labels) and max(labels) > 900
    mtime = os.stat(path).st_mtime_ns
    assert bench.write_list_file(str(tmp_path), 30_000, 1_000, seed=0) == path
    assert os.stat(path).st_mtime_ns == mtime  # reused
    *_, parsed = parse_list_file(path)
    assert len(parsed) == 30_000 and len(np.unique(parsed)) == 1_000


@pytest.mark.slow
def test_benchmark_compares_both_parsers_and_writes_json(tmp_path):
    out = tmp_path / 'index.json'
    result = bench.main(['--data-dir', str(tmp_path / 'data'), '--num-lines', '3000', '--num-classes', '100',
                         '--probe-lines', '1000', '--baseline-max-gib', '1e-9', '--workers', '2',
                         '--batches', '2', '--batch-size', '16', '--out', str(out)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(result))
    rows = [(r['impl'], r['num_lines'], r['run']) for r in result['rows']]
    # the projected baseline exceeds the limit: mmpretrain on a prefix, ours there too
    assert rows == [('vit_plugin', 3000, 'cold'), ('vit_plugin', 3000, 'warm'), ('vit_plugin', 1000, 'cold'),
                    ('vit_plugin', 1000, 'warm'), ('mmpretrain', 1000, 'no cache')]
    assert 'first 1000 lines' in result['notes'][1]
    for row in result['rows']:
        assert row['samples_read'] == 32 and len(row['worker_pss_mib']) == 2
        assert all(0 < p < 4096 for p in row['worker_pss_mib']) and row['startup_s'] > 0
        assert row['first_record'] == result['rows'][0]['first_record']
    assert result['rows'][0]['first_record']['img_path'].startswith('train/n')
