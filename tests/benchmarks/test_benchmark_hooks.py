"""tools/analysis/benchmark_hooks.py at a toy size (a run of the tool, not a measurement)."""
import json

from benchmarks import benchmark_hooks


def test_one_round_times_every_variant_and_pairs_the_extra_cost(tmp_path):
    out = tmp_path / 'hooks.json'
    result = benchmark_hooks.main(['--rounds', '2', '--iters', '3', '--skip', '0', '--dims', '16', '--layers', '1',
                                   '--img-size', '8', '--batch', '2', '--out', str(out)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(result))
    rows = result['rows']
    assert list(rows) == list(benchmark_hooks.VARIANTS)
    assert all(len(row['times_s']) == 2 and row['ms_per_iter'] > 0 for row in rows.values())
    assert 'extra_ms' not in rows['none'] and all('extra_ms' in rows[v] for v in ('guard', 'preemption', 'both'))
