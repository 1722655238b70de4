"""tools/analysis/benchmark_dataset_index.py: its synthetic ImageNet-21k list file, a run at a toy size, and
the prefix it measures both parsers on when the baseline would not fit."""
import contextlib
import io
import itertools
import json
import os
import os.path as osp
import re
import subprocess
import sys

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
def test_benchmark_compares_both_parsers_in_child_processes_and_writes_json(tmp_path):
    """Every measurement in a fresh interpreter that reads batches with data-loader workers."""
    out, data = tmp_path / 'index.json', tmp_path / 'data'
    result = bench.main(['--data-dir', str(data), '--num-lines', '3000', '--num-classes', '100',
                         '--probe-lines', '3000', '--workers', '2', '--batches', '2', '--batch-size', '16',
                         '--out', str(out)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(result))
    rows = [(r['impl'], r['num_lines'], r['run']) for r in result['rows']]
    # the baseline fits (no probe at --probe-lines lines or fewer): mmpretrain on the whole file
    assert rows == [('vit_plugin', 3000, 'cold'), ('vit_plugin', 3000, 'warm'), ('mmpretrain', 3000, 'no cache')]
    assert result['notes'] == [] and osp.exists(data / 'meta' / 'train.txt.index')  # the cold run wrote it
    for row in result['rows']:
        assert row['samples_read'] == 32 and len(row['worker_pss_mib']) == 2
        assert all(0 < p < 4096 for p in row['worker_pss_mib']) and row['startup_s'] > 0
        assert row['first_record'] == result['rows'][0]['first_record']
    assert result['rows'][0]['first_record']['img_path'].startswith('train/n')


def test_a_baseline_over_the_limit_runs_on_a_prefix_for_both_parsers(tmp_path, monkeypatch):
    """The probe's projection exceeds ``--baseline-max-gib``: mmpretrain, and vit_plugin again, are measured
    on the file's first lines. The child processes run in this one (their command line parsed by the
    same ``main``); the other test starts real ones."""
    children = []

    def child(cmd, **kwargs):
        assert cmd[:3] == [sys.executable, '-m', 'benchmarks.benchmark_dataset_index'], cmd
        children.append(cmd[cmd.index('--measure') + 1:cmd.index('--measure') + 4:2])
        stdout = io.StringIO()
        with contextlib.redirect_stdout(stdout):
            assert bench.main(cmd[3:]) == {}
        return subprocess.CompletedProcess(cmd, 0, stdout.getvalue(), '')

    monkeypatch.setattr(bench.subprocess, 'run', child)
    # A fresh child's peak RSS grows while it parses; this process's peak may already stand higher than
    # anything the in-process run reaches, so the peak reads as growing by 64 MiB a measurement.
    peaks = itertools.count(0, 64)
    monkeypatch.setattr(bench, 'max_rss_mib', lambda: next(peaks))
    result = bench.main(['--data-dir', str(tmp_path / 'data'), '--num-lines', '3000', '--num-classes', '100',
                         '--probe-lines', '1000', '--baseline-max-gib', '1e-9', '--workers', '0'])
    rows = [(r['impl'], r['num_lines'], r['run']) for r in result['rows']]
    assert rows == [('vit_plugin', 3000, 'cold'), ('vit_plugin', 3000, 'warm'), ('vit_plugin', 1000, 'cold'),
                    ('vit_plugin', 1000, 'warm'), ('mmpretrain', 1000, 'no cache')]
    prefix = str(tmp_path / 'data' / 'meta' / 'train_first1000.txt')
    assert children[2] == ['mmpretrain', prefix]  # the probe, on the prefix of --probe-lines lines
    assert len(children) == 6 and children[5] == ['mmpretrain', prefix]
    assert "projected" in result['notes'][0] and 'first 1000 lines' in result['notes'][1]
    assert len(open(prefix).read().splitlines()) == 1000
    assert all(row['first_record'] == result['rows'][0]['first_record'] for row in result['rows'])
