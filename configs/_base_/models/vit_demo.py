# The demo model: a small ViT for 32x32 digit images (patch 8 -> a 4x4 grid of 16 tokens plus the
# class token). Sized so that `make demo` trains it in minutes on a CPU (its result: README.md);
# everything else (class token, pre-norm blocks, zero-initialised head) is the paper's ViT.
model = dict(
    type='ImageClassifier',
    backbone=dict(
        type='vit_plugin.ViT',
        arch=dict(embed_dims=128, num_layers=4, num_heads=4, mlp_dims=256),
        img_size=32,
        patch_size=8,
        drop_rate=0.1,
    ),
    neck=None,
    head=dict(
        type='VisionTransformerClsHead',
        num_classes=10,
        in_channels=128,
        loss=dict(type='CrossEntropyLoss', loss_weight=1.0),
    ),
)
