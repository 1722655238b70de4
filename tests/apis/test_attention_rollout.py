"""tools/analysis/attention_rollout.py (vit_plugin.apis.attention_rollout) on a tiny ViT of a real config."""
import os.path as osp

import pytest

from helpers.figure_tools import assert_png, image_argv, make_tiny
from vit_plugin.apis import attention_rollout as tool
from vit_plugin.apis.cli import run

EXTRA = ['--images', '{images}']


@pytest.fixture(scope='module')
def tiny(tmp_path_factory):
    return make_tiny(tmp_path_factory.mktemp('figures'))


def test_writes_png_and_refuses_a_wrong_checkpoint(tiny, capsys):
    out = str(tiny['tmp'] / 'attention_rollout.png')
    assert run(tool.main, [tiny['config'], tiny['ckpt'], '--out', out] + image_argv(EXTRA, tiny)) == 0
    assert_png(out)
    assert run(tool.main, [tiny['config'], tiny['wrong'], '--out', out + '.bad.png'] + image_argv(EXTRA, tiny)) == 2
    err = capsys.readouterr().err
    assert 'does not fit the ViT' in err and 'backbone.' in err and 'pass the config it was trained with' in err
    assert not osp.exists(out + '.bad.png')
