# ViT-B/16 (paper Table 1: 12 layers, D=768, MLP 3072, 12 heads; 86,567,656 parameters with a
# 1000-class head) with the paper's pre-training head: one tanh hidden layer ("pre-logits") and a
# zero-initialised classifier, for the 21,843 classes of the official ImageNet-21k release.
# Fine-tuning configs replace the head by a single zero-initialised linear layer (hidden_dim=None).
model = dict(
    type='ImageClassifier',
    backbone=dict(
        type='vit_plugin.ViT',
        arch='b',
        img_size=224,
        patch_size=16,
        drop_rate=0.1,  # paper Table 3: dropout 0.1 for ImageNet(-21k) pre-training, 0.0 on JFT
        # The official model's numerics, declared so that its checkpoints load without changing the model
        # (docs/checkpoints.md#numerics-records): Flax's tanh GELU, LayerNorm eps 1e-6, pixels to [-1, 1].
        gelu_approximate='tanh',
        norm_eps=1e-6,
        expected_input_norm=dict(mean=[127.5] * 3, std=[127.5] * 3),
    ),
    neck=None,
    head=dict(
        type='VisionTransformerClsHead',
        num_classes=21843,
        in_channels=768,
        hidden_dim=768,
        loss=dict(type='CrossEntropyLoss', loss_weight=1.0),
    ),
)
