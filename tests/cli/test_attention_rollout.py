"""tools/analysis/attention_rollout.py (vit_plugin.cli.attention_rollout) on a tiny ViT of a real config."""
from helpers.figure_tools import check_figure_tool
from vit_plugin.cli import attention_rollout as tool

EXTRA = ['--images', '{images}']


def test_writes_png_and_refuses_a_wrong_checkpoint(tiny, capsys):
    check_figure_tool(tool.main, 'attention_rollout', EXTRA, tiny, capsys)
