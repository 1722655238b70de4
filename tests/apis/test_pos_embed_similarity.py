"""tools/analysis/pos_embed_similarity.py (vit_plugin.apis.pos_embed_similarity) on a tiny ViT of a real config."""
import os.path as osp

import pytest

from helpers.figure_tools import assert_png, image_argv, make_tiny
from vit_plugin.apis import pos_embed_similarity as tool
from vit_plugin.apis.cli import run

EXTRA = []


@pytest.fixture(scope='module')
def tiny(tmp_path_factory):
    return make_tiny(tmp_path_factory.mktemp('figures'))


def test_writes_png_and_refuses_a_wrong_checkpoint(tiny, capsys):
    out = str(tiny['tmp'] / 'pos_embed_similarity.png')
    assert run(tool.main, [tiny['config'], tiny['ckpt'], '--out', out] + image_argv(EXTRA, tiny)) == 0
    assert_png(out)
    assert run(tool.main, [tiny['config'], tiny['wrong'], '--out', out + '.bad.png'] + image_argv(EXTRA, tiny)) == 2
    err = capsys.readouterr().err
    assert 'does not fit the ViT' in err and 'backbone.' in err and 'pass the config it was trained with' in err
    assert not osp.exists(out + '.bad.png')


def test_tools_refuse_a_model_without_vit(tiny, tmp_path, capsys):
    cfg = tmp_path / 'resnet.py'
    cfg.write_text("default_scope = 'mmpretrain'\n"
                   "model = dict(type='ImageClassifier', backbone=dict(type='ResNet', depth=18),\n"
                   "             head=dict(type='LinearClsHead', num_classes=10, in_channels=512))\n")
    assert run(tool.main, [str(cfg), tiny['ckpt']]) == 2
    assert 'contains no vit_plugin.ViT backbone' in capsys.readouterr().err
