"""Parameter and FLOP counts of the paper's ViT models (the model summary and its Table 1 rows)."""
import pytest

from helpers.figure_tools import TINY
from vit_plugin.evaluation.model_complexity import measure_model, summary_rows, vit_flops, vit_param_count
from vit_plugin.models.backbones.vit import ViT


def test_parameter_counts_equal_the_official_models_and_flops_equal_torch():
    official = {('base', 16): 86_567_656, ('base', 32): 88_224_232, ('large', 16): 304_326_632,
                ('large', 32): 306_535_400, ('huge', 14): 632_045_800}
    for (arch, patch), count in official.items():
        assert vit_param_count(arch, patch, 224) == count
    vit = ViT(arch=TINY, img_size=(24, 32), patch_size=8).eval()
    params, macs = measure_model(vit, (1, 3, 24, 32))
    assert params == vit_param_count(TINY, 8, (24, 32), num_classes=0)
    assert macs == vit_flops(TINY, 8, (24, 32), num_classes=0)
    b16 = next(r for r in summary_rows() if r['model'] == 'ViT-B/16' and r['resolution'] == 224)
    assert b16['paper_params'] == '86M' and b16['tokens'] == 197 and b16['gflops'] == pytest.approx(17.56, abs=0.01)
