"""tools/analysis/patch_filters.py (vit_plugin.cli.patch_filters) on a tiny ViT of a real config."""
from helpers.figure_tools import check_figure_tool
from vit_plugin.cli import patch_filters as tool

EXTRA = []


def test_writes_png_and_refuses_a_wrong_checkpoint(tiny, capsys):
    check_figure_tool(tool.main, 'patch_filters', EXTRA, tiny, capsys)
