# The convolutional baseline of the shapes detector (mask_rcnn_vit_tiny_simplefpn_shapes.py): mmdet's
# ResNet-18 and FPN, trained from scratch, in place of the ViT and its simple feature pyramid. Everything
# else is inherited unchanged: the RPN and RoI heads (width 64), the data pipeline and [-1, 1] input
# scaling, the 24-epoch schedule and AdamW (lr 1e-3, weight decay 0.05, gradient clipping at 1).
_base_ = './mask_rcnn_vit_tiny_simplefpn_shapes.py'

width = 64
model = dict(
    backbone=dict(
        _delete_=True,
        type='ResNet',  # mmdet's
        depth=18,
        num_stages=4,
        out_indices=(0, 1, 2, 3),
        frozen_stages=-1,
        # from scratch: batch statistics are trained and used (batches of 8 images)
        norm_cfg=dict(type='BN', requires_grad=True),
        norm_eval=False,
        style='pytorch',
        init_cfg=None),  # mmdet's default: Kaiming convolutions, BN weights 1
    # strides 4, 8, 16, 32 plus one pooled level: the same 5 pyramid levels as the ViT's
    neck=dict(_delete_=True, type='FPN', in_channels=[64, 128, 256, 512], out_channels=width, num_outs=5))

# Plain AdamW: the layer-decay constructor needs a ViT. Norms and biases get no weight decay, as the
# ViT's constructor exempts them.
optim_wrapper = dict(
    _delete_=True,
    type='vit_plugin.GuardedOptimWrapper',  # drops NaN/inf updates (docs/configs.md)
    optimizer=dict(type='AdamW', lr=1e-3, betas=(0.9, 0.999), weight_decay=0.05),
    paramwise_cfg=dict(norm_decay_mult=0., bias_decay_mult=0.),
    clip_grad=dict(max_norm=1.0, norm_type=2))
