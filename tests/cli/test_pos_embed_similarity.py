"""tools/analysis/pos_embed_similarity.py (vit_plugin.cli.pos_embed_similarity) on a tiny ViT of a real config."""
from helpers.figure_tools import check_figure_tool
from vit_plugin.cli import pos_embed_similarity as tool
from vit_plugin.cli.common import run

EXTRA = []


def test_writes_png_and_refuses_a_wrong_checkpoint(tiny, capsys):
    check_figure_tool(tool.main, 'pos_embed_similarity', EXTRA, tiny, capsys)


def test_tools_refuse_a_model_without_vit(tiny, tmp_path, capsys):
    cfg = tmp_path / 'resnet.py'
    cfg.write_text("default_scope = 'mmpretrain'\n"
                   "model = dict(type='ImageClassifier', backbone=dict(type='ResNet', depth=18),\n"
                   "             head=dict(type='LinearClsHead', num_classes=10, in_channels=512))\n")
    assert run(tool.main, [str(cfg), tiny['ckpt']]) == 2
    assert 'contains no vit_plugin.ViT backbone' in capsys.readouterr().err
