"""tools/analysis/benchmark_pipeline.py: its seeded JPEGs, and a run at a toy size."""
import json

import cv2

from benchmarks import benchmark_pipeline as bench


def read(path):
    with open(path, 'rb') as f:
        return f.read()


def test_benchmark_images_are_imagenet_sized_jpegs(tmp_path):
    paths = bench.make_jpegs(str(tmp_path), 12, 500, 90, seed=0)
    (tmp_path / 'again').mkdir()
    shapes = [cv2.imread(p).shape for p in paths]
    assert set(shapes) <= {(375, 500, 3), (500, 375, 3)} and len(set(shapes)) == 2
    again = bench.make_jpegs(str(tmp_path / 'again'), 12, 500, 90, seed=0)
    assert [read(p) for p in again] == [read(p) for p in paths]  # seeded: the same files


def test_benchmark_runs_at_a_toy_size(tmp_path):
    out = tmp_path / 'pipeline.json'
    result = bench.main(['--num-images', '3', '--repeats', '1', '--warmup', '0', '--out', str(out)])
    saved = json.loads(out.read_text())
    assert saved == json.loads(json.dumps(result))
    assert set(saved['pipelines']) == set(bench.PIPELINES)
    for name, row in saved['pipelines'].items():
        assert row['images_per_s'] > 0 and row['repeats'] == 1
        assert ('ours_speedup' in row) == (name != 'ours')
    assert {'cv2.imdecode', 'pillow', 'torchvision.io'} <= set(saved['decoders'])
    assert saved['setting']['num_images'] == 3 and saved['setting']['threads'] == 1
