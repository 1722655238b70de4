"""tools/analysis/benchmark_detection.py at a toy size (a run of the tool, not a measurement)."""
import json

import pytest

from benchmarks import benchmark_detection


@pytest.mark.slow
def test_a_variant_runs_in_its_own_process_and_reports_time_and_memory(tmp_path, capsys):
    out = tmp_path / 'detection.json'
    benchmark_detection.main(['--arch', 'ti', '--img-size', '64', '--steps', '1', '--threads', '1', '--only', '0',
                              '--out', str(out)])
    saved = json.loads(out.read_text())
    row, = saved['results']
    assert row['variant'] == benchmark_detection.VARIANTS[0][0] and row['threads'] == 1
    assert row['step_s'] > 0 and row['peak_rss_mib'] > 0 and row['loss'] > 0
    assert '| global attention |' in capsys.readouterr().out
