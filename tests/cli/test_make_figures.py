"""tools/analysis/make_figures.py (vit_plugin.cli.make_figures): every figure of a tiny checkpoint."""
import json
import math

from helpers.figure_tools import TINY, assert_png
from vit_plugin.cli import make_figures as tool


def test_make_figures_uses_the_config_dataset(tiny):
    out_dir = tiny['tmp'] / 'gallery'
    written = tool.main([tiny['config'], tiny['ckpt'], '--out-dir', str(out_dir), '--num-images', '6',
                         '--rollout-images', '3'])
    assert len(written) == 5
    for path in written:
        assert_png(path)
    dist = json.load(open(out_dir / 'attention_distance.json'))
    assert dist['num_images'] == 6 and len(dist['mean_distance_px']) == TINY['num_layers']
    assert all(0 <= v <= math.hypot(16, 16) for layer in dist['mean_distance_px'] for v in layer)
