"""tools/analysis/benchmark_input_checks.py at a toy size (a run of the tool, not a measurement)."""
import json
import re

from benchmarks import benchmark_input_checks


def test_input_check_benchmark_runs_at_a_toy_size(tmp_path):
    bench = benchmark_input_checks
    out = tmp_path / 'checks.json'
    result = bench.main(['--data-dir', str(tmp_path / 'data'), '--num-lines', '20000', '--num-classes', '500',
                         '--label-repeats', '1', '--num-images', '3', '--repeats', '1', '--out', str(out)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(result))
    labels = result['label_check']
    assert labels['lines'] == 20000 and labels['check_s'] > 0 and labels['failing_check_s'] > 0
    assert re.search(r'train\.txt, line \d+: label 499 is outside \[0, 499\)', labels['failing_message'])
    rows = result['decode']['rows']
    assert set(rows) == {'cv2.imdecode (no checks)', 'decode_image (checked)', 'inspect_image (checks only)'}
    assert all(row['ms_per_image'] > 0 for row in rows.values())
