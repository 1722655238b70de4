"""Small models and data built in-process, shared by the mixed-precision tests on the CPU and on CUDA."""
import torch
from mmengine.registry import MODELS, init_default_scope

import vit_plugin  # noqa: F401  (registers vit_plugin.*)


def toy_classifier():
    """An mmpretrain ``ImageClassifier`` around a 2-block ``vit_plugin.ViT`` (32-px images, 10 classes),
    built under the mmpretrain scope from seed 0."""
    from mmpretrain.utils import register_all_modules
    register_all_modules(init_default_scope=False)
    init_default_scope('mmpretrain')
    torch.manual_seed(0)
    return MODELS.build(dict(
        type='ImageClassifier',
        data_preprocessor=dict(type='ClsDataPreprocessor', mean=[127.5] * 3, std=[127.5] * 3),
        backbone=dict(type='vit_plugin.ViT', arch=dict(embed_dims=64, num_layers=2, num_heads=4, mlp_dims=128),
                      img_size=32, patch_size=8),
        head=dict(type='VisionTransformerClsHead', num_classes=10, in_channels=64,
                  loss=dict(type='CrossEntropyLoss'))))


def template_batches(n=20, batch=16):
    """``n`` batches of ``batch`` 32-px images for :func:`toy_classifier`: class templates plus noise,
    learnable within a few steps."""
    from mmpretrain.structures import DataSample
    g = torch.Generator().manual_seed(0)
    templates = torch.randint(0, 256, (10, 3, 32, 32), generator=g).float()
    batches = []
    for _ in range(n):
        labels = torch.randint(0, 10, (batch,), generator=g)
        noise = torch.randn(batch, 3, 32, 32, generator=g) * 40
        images = (templates[labels] + noise).clamp(0, 255).to(torch.uint8)
        batches.append(dict(inputs=list(images), data_samples=[DataSample().set_gt_label(int(y)) for y in labels]))
    return batches
