"""tools/analysis/model_summary.py (vit_plugin.cli.model_summary): the table and figure, with a config's row."""
from helpers.figure_tools import assert_png
from vit_plugin.cli import model_summary as tool
from vit_plugin.cli.common import run


def test_model_summary_tool_adds_the_config_row(tiny, capsys):
    out = str(tiny['tmp'] / 'summary.png')
    assert run(tool.main, ['--config', tiny['config'], '--checkpoint', tiny['ckpt'], '--out', out]) == 0
    assert_png(out)
    table = open(out[:-4] + '.md').read()
    assert '| ViT-H/14 | 224 | 32 | 1280 | 5120 | 16 | 257 | 632.0M | 167.3 | 632M |' in table
    assert '| tiny_vit | 16 | 2 | 32 | 64 | 2 |' in table
    assert run(tool.main, ['--config', tiny['config'], '--checkpoint', tiny['wrong'], '--out', out]) == 2
    assert 'does not fit the ViT' in capsys.readouterr().err
