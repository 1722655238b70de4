"""Strict loading (``vit_plugin.checkpoint.load_checkpoint_strict``): a checkpoint whose head does not fit
the config is refused by tools/infer.py and the ONNX export with the shapes and the way out, the loading
hook still adapts the position embedding, and a checkpoint of another model is refused by name."""
import os.path as osp
import re

import pytest
import torch
from mmengine.config import Config
from mmengine.registry import init_default_scope
from PIL import Image

from helpers.bad_images import photo
from helpers.common import REPO
from vit_plugin.cli.export_onnx import main as export_main
from vit_plugin.cli.infer import main as infer_main


@pytest.fixture(scope='module', autouse=True)
def mmpretrain_scope():
    init_default_scope('mmpretrain')


# ----------------------------------------------------------------------- checkpoints for inference
def tiny_classifier(tmp_path, head_classes):
    """The demo config shrunk to 2 blocks, and a checkpoint of it whose head has ``head_classes``."""
    cfg = tmp_path / 'tiny.py'
    cfg.write_text(f"""
_base_ = [{osp.join(REPO, 'configs', 'vit_demo_digits.py')!r}]
model = dict(backbone=dict(arch=dict(_delete_=True, embed_dims=32, num_layers=2, num_heads=2, mlp_dims=64)),
             head=dict(in_channels=32))
test_dataloader = dict(dataset=dict(data_root={str(tmp_path / 'digits')!r}))
""")
    from mmengine.registry import DefaultScope
    from mmpretrain.registry import MODELS
    config = Config.fromfile(str(cfg))
    config.model.head.num_classes = head_classes
    with DefaultScope.overwrite_default_scope('mmpretrain'):
        model = MODELS.build(config.model)
    ckpt = tmp_path / f'head{head_classes}.pth'
    torch.save(dict(meta=dict(dataset_meta=dict(classes=[str(i) for i in range(head_classes)])),
                    state_dict=model.state_dict()), ckpt)
    return str(cfg), str(ckpt)


def test_infer_and_export_refuse_a_checkpoint_whose_head_does_not_fit(tmp_path, corpus):
    config, wrong = tiny_classifier(tmp_path, head_classes=7)  # the config's head has 10 classes
    _, right = tiny_classifier(tmp_path, head_classes=10)
    image = str(tmp_path / 'digit.png')  # the demo's test pipeline takes 32x32 images as they are
    Image.fromarray(photo(32, 32)).save(image)
    infer = infer_main
    shapes = re.escape('head.layers.head.weight has shape (7, 32) in the checkpoint and (10, 32) in the model')
    with pytest.raises(SystemExit, match=shapes + '.*pass --backbone-only to load only the backbone on purpose'):
        infer([config, wrong, image, '--device', 'cpu'])
    assert len(infer([config, right, image, '--device', 'cpu', '--topk', '2'])[0]['topk']) == 2
    assert len(infer([config, wrong, image, '--device', 'cpu', '--backbone-only'])) == 1  # on purpose
    with pytest.raises(SystemExit, match=r'text\.JPEG: not an image'):
        infer([config, right, corpus['text.JPEG'].path, '--device', 'cpu'])

    export = export_main
    with pytest.raises(SystemExit, match=shapes + '.*pass --part backbone'):
        export([config, wrong, '--out', str(tmp_path / 'wrong.onnx')])
    assert not osp.exists(tmp_path / 'wrong.onnx')
    result = export([config, wrong, '--out', str(tmp_path / 'backbone.onnx'), '--part', 'backbone'])
    assert osp.isfile(result['onnx'])


def test_strict_loading_still_adapts_the_position_embedding_and_refuses_other_models(tmp_path):
    from mmpretrain.apis import get_model

    from vit_plugin.checkpoint import CheckpointMismatchError, load_checkpoint_strict
    config, right = tiny_classifier(tmp_path, head_classes=10)
    cfg = Config.fromfile(config)
    cfg.model.backbone.img_size = 48  # another grid: the loading hook resizes the position embedding
    model = get_model(cfg, pretrained=False)
    assert load_checkpoint_strict(model, right)['meta']['dataset_meta']['classes'][9] == '9'
    cfg.model.backbone.arch.num_layers = 3
    with pytest.raises(CheckpointMismatchError, match=r'the checkpoint has 2 encoder blocks but the model has 3'):
        load_checkpoint_strict(get_model(cfg, pretrained=False), right)
    cfg.model.backbone.arch.num_layers = 2
    cfg.model.head.hidden_dim = 16  # a pre-logits layer the checkpoint lacks
    with pytest.raises(CheckpointMismatchError, match=r'head\.layers\.pre_logits\.weight \(16, 32\) is not in the '
                                                      r'checkpoint'):
        load_checkpoint_strict(get_model(cfg, pretrained=False), right)
