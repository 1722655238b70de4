"""tools/analysis/attention_distance.py (vit_plugin.cli.attention_distance) on a tiny ViT of a real config."""
from helpers.figure_tools import check_figure_tool
from vit_plugin.cli import attention_distance as tool

EXTRA = ['--images', '{images}']


def test_writes_png_and_refuses_a_wrong_checkpoint(tiny, capsys):
    check_figure_tool(tool.main, 'attention_distance', EXTRA, tiny, capsys)
