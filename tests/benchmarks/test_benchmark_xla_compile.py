"""tools/analysis/benchmark_xla_compile.py at a toy size on torch_xla's CPU backend (a run, not a measurement)."""
import json
import os
import os.path as osp
import subprocess
import sys

import pytest

from helpers.common import REPO


@pytest.mark.xla
def test_compile_benchmark_runs_both_variants_to_the_same_loss(tmp_path):
    out = tmp_path / 'compile.json'
    env = dict(os.environ, PJRT_DEVICE='CPU', OMP_NUM_THREADS='1', PYTHONPATH=REPO)  # this checkout's package
    proc = subprocess.run([sys.executable, osp.join(REPO, 'tools', 'analysis', 'benchmark_xla_compile.py'),
                           '--arch-dict', '16', '2', '2', '32', '--img-size', '16', '--patch-size', '8',
                           '--batch-size', '2', '--steps', '3', '--out', str(out)],
                          env=env, capture_output=True, text=True, timeout=600, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert 'scan / unrolled: compile' in proc.stdout
    results = json.loads(out.read_text())['results']
    unrolled, scan = results['unrolled'], results['scan']
    assert unrolled['depth'] == scan['depth'] == 2 and unrolled['params'] == scan['params']
    assert unrolled['compiles'] >= 1 and scan['compiles'] >= 1 and scan['compile_s'] > 0
    assert abs(unrolled['last_loss'] - scan['last_loss']) < 1e-4
