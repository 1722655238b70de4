"""A tiny ViT classifier of a real config with a checkpoint, a checkpoint of another model and a few
images, for the tests of the figure tools (vit_plugin.cli.attention_distance, ...)."""
import os.path as osp

import numpy as np
import torch
from mmengine.registry import MODELS
from PIL import Image

import vit_plugin  # noqa: F401  (registers vit_plugin.*)
from helpers.common import REPO
from vit_plugin.cli.common import run
from vit_plugin.evaluation.model_loading import load_config
from vit_plugin.models.backbones.vit import ViT

TINY = dict(embed_dims=32, num_layers=2, num_heads=2, mlp_dims=64)


def make_tiny(tmp):
    """A config file (the demo config with a tiny ViT, data in a temp dir), a checkpoint, a wrong one, images."""
    cfg_path = tmp / 'tiny_vit.py'
    cfg_path.write_text(f"_base_ = ['{osp.join(REPO, 'configs', 'vit_demo_digits.py')}']\n"
                        f"model = dict(backbone=dict(arch={TINY!r}, img_size=16, patch_size=4),\n"
                        f"             head=dict(in_channels={TINY['embed_dims']}))\n"
                        f"test_dataloader = dict(dataset=dict(data_root='{tmp / 'digits'}'))\n")
    cfg = load_config(str(cfg_path))
    model = MODELS.build(cfg.model)
    model.init_weights()
    torch.save(dict(state_dict=model.state_dict(), meta=dict()), tmp / 'tiny.pth')
    other = ViT(arch=dict(TINY, embed_dims=48), img_size=16, patch_size=4)  # another width
    torch.save(dict(state_dict={f'backbone.{k}': v for k, v in other.state_dict().items()}), tmp / 'other.pth')
    images = []
    for i in range(3):
        path = tmp / f'img{i}.png'
        Image.fromarray((np.random.default_rng(i).random((20, 24, 3)) * 255).astype(np.uint8)).save(path)
        images.append(str(path))
    return dict(config=str(cfg_path), ckpt=str(tmp / 'tiny.pth'), wrong=str(tmp / 'other.pth'), images=images,
                tmp=tmp)


def image_argv(extra, tiny):
    """``extra`` with ``'{images}'`` replaced by the image files."""
    out = []
    for a in extra:
        out += tiny['images'] if a == '{images}' else [a]
    return out


def assert_png(path):
    assert osp.getsize(path) > 1000
    with open(path, 'rb') as f:
        assert f.read(8) == b'\x89PNG\r\n\x1a\n'


def check_figure_tool(main, name, extra, tiny, capsys):
    """A figure tool's ``main`` (run as its script runs it) writes its PNG from the tiny checkpoint, and
    refuses a checkpoint of another width with an ``error:`` line that names the fix, writing nothing."""
    out = str(tiny['tmp'] / f'{name}.png')
    assert run(main, [tiny['config'], tiny['ckpt'], '--out', out] + image_argv(extra, tiny)) == 0
    assert_png(out)
    assert run(main, [tiny['config'], tiny['wrong'], '--out', out + '.bad.png'] + image_argv(extra, tiny)) == 2
    err = capsys.readouterr().err
    assert 'does not fit the ViT' in err and 'backbone.' in err and 'pass the config it was trained with' in err
    assert not osp.exists(out + '.bad.png')
