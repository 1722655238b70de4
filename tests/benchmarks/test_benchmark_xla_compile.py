"""tools/analysis/benchmark_xla_compile.py at a toy size on torch_xla's CPU backend (a run, not a measurement).

The tool's ``main`` runs in the test process; it starts each variant in a fresh process, as it does for users."""
import json

import pytest

from benchmarks import benchmark_xla_compile as bench


@pytest.mark.xla
def test_compile_benchmark_runs_both_variants_to_the_same_loss(tmp_path, monkeypatch, capsys):
    out = tmp_path / 'compile.json'
    monkeypatch.setenv('PJRT_DEVICE', 'CPU')
    monkeypatch.setenv('OMP_NUM_THREADS', '1')  # the variants' processes
    # The CPU backend's LLVM optimisations only make the toy graphs compile slower; both variants compile
    # under the same flags.
    monkeypatch.setenv('XLA_FLAGS', '--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true')
    bench.main(['--arch-dict', '16', '2', '2', '32', '--img-size', '16', '--patch-size', '8', '--batch-size', '2',
                '--steps', '3', '--out', str(out)])
    assert 'scan / unrolled: compile' in capsys.readouterr().out
    results = json.loads(out.read_text())['results']
    unrolled, scan = results['unrolled'], results['scan']
    assert unrolled['depth'] == scan['depth'] == 2 and unrolled['params'] == scan['params']
    assert unrolled['compiles'] >= 1 and scan['compiles'] >= 1 and scan['compile_s'] > 0
    assert abs(unrolled['last_loss'] - scan['last_loss']) < 1e-4
