"""A demo classifier checkpoint for the tests of the tools that read one (test, infer, export)."""
import os.path as osp

import torch
from mmengine.config import Config
from mmengine.registry import DefaultScope
from mmpretrain.registry import MODELS

from helpers.common import REPO


def tiny_demo_checkpoint(tmp_path, digits_root):
    """configs/vit_demo_digits.py shrunk to a 2-block ViT, random weights, saved as a runner
    checkpoint with the digits' class names (what tools/infer.py and the exporter read)."""
    cfg = tmp_path / 'tiny.py'
    cfg.write_text(f"""
_base_ = [{osp.join(REPO, 'configs', 'vit_demo_digits.py')!r}]
model = dict(backbone=dict(arch=dict(_delete_=True, embed_dims=32, num_layers=2, num_heads=2, feedforward_channels=64)),
             head=dict(in_channels=32))
test_dataloader = dict(dataset=dict(data_root={digits_root!r}))
val_dataloader = test_dataloader
""")
    config = Config.fromfile(str(cfg))
    with DefaultScope.overwrite_default_scope('mmpretrain'):
        model = MODELS.build(config.model)
    model.init_weights()
    torch.manual_seed(0)
    with torch.no_grad():  # the head starts at zero (constant logits): make every output depend on the weights
        for param in model.parameters():
            param.add_(torch.randn_like(param) * 0.2)
    ckpt = tmp_path / 'tiny.pth'
    torch.save(dict(meta=dict(dataset_meta=dict(classes=[str(i) for i in range(10)])), state_dict=model.state_dict()),
               ckpt)
    return str(cfg), str(ckpt)
