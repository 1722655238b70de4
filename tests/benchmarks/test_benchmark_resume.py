"""tools/analysis/benchmark_resume.py at a toy size (a run of the tool, not a measurement)."""
import json

import mmengine
import pytest

from benchmarks import benchmark_resume as bench

RESUME_AT = 12


@pytest.fixture(scope='module')
def result(tmp_path_factory):
    root = tmp_path_factory.mktemp('resume_bench')
    out = root / 'resume.json'
    found = bench.main(['--data-dir', str(root / 'data'), '--num-images', '16', '--long-side', '64',
                        '--num-classes', '5', '--shard-size', '8', '--resume-at', str(RESUME_AT), '--batch', '4',
                        '--rounds', '1', '--out', str(out)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(found))
    return found


def test_each_run_uses_the_loop_and_sampler_it_names(result):
    first = {name: (runs[0]['loop'], runs[0]['sampler']) for name, runs in result['runs'].items()}
    ours = ('vit_plugin.engine.loops.IterBasedTrainLoop', 'vit_plugin.datasets.samplers.BlockShuffleSampler')
    assert first == {'fresh': ours, 'after': ours,
                     'before': ('mmengine.runner.loops.IterBasedTrainLoop', 'mmengine.dataset.sampler.InfiniteSampler')}


def test_resumed_runs_train_the_iteration_after_the_checkpoint_first(result):
    firsts = {name: runs[0]['first_iteration'] for name, runs in result['runs'].items()}
    assert firsts == {'fresh': 0, 'before': RESUME_AT, 'after': RESUME_AT}  # 0-based: the checkpoint's count
    assert result['setting']['mmengine'] == mmengine.__version__


def test_the_cost_of_a_skipped_batch_is_paired_with_the_fresh_start_and_extrapolated():
    rows = bench.summarise({'fresh': [1.0, 2.0, 1.5], 'before': [21.0, 30.0, 11.5], 'after': [1.0, 2.1, 1.6]},
                           resume_at=1000)
    assert rows['before']['skip_s_per_batch'] == pytest.approx(0.02)  # per round: 20, 28, 10 ms -> median 20
    assert rows['before']['extrapolated_s'] == pytest.approx(0.02 * bench.EXTRAPOLATE_TO)
    assert rows['after']['skip_s_per_batch'] == pytest.approx(1e-4) and 'skip_s_per_batch' not in rows['fresh']
