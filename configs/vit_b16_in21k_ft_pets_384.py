# ViT-B/16: ImageNet-21k -> Oxford-IIIT Pets at 384 px.
# Fine-tuning of an ImageNet-21k pre-trained ViT-B/16 at 384 px with the paper's recipe (Appendix B.1.1):
# SGD momentum 0.9, batch 512, no weight decay, clip at global norm 1, cosine decay, 500 steps
# (Table 4). The recipe's 500 warm-up steps would fill the whole run, so this config warms up for
# the first 50 steps instead (see `warmup_steps` below). The pre-training head (pre-logits +
# classifier) is dropped and a single zero-initialised linear layer is attached; the 14x14 position
# embedding is interpolated in 2D to the 24x24 grid of 384 px when the weights load, in the
# backbone's default mode 'official' (the official loader's bilinear; see CHECKPOINT_RESIZE_MODE in
# vit_plugin/models/pos_embed.py).
_base_ = [
    '_base_/models/vit_b16.py',
    '_base_/datasets/pets_384.py',
    '_base_/schedules/vit_finetune.py',
    '_base_/default_runtime.py',
]

# Your pre-trained weights: a runner checkpoint of configs/vit_b16_in21k.py (its path is written to
# work_dirs/vit_b16_in21k/last_checkpoint), or an official .npz / its conversion by
# tools/convert_checkpoint.py. All three hold a whole classifier (backbone.*, head.*): keep
# prefix='backbone.', or drop it (prefix=None) and the bare backbone takes the 'backbone.' part itself.
# Official weights also record the GELU they were trained with (tanh), which the backbone then runs.
pretrained = 'checkpoints/vit_b16_in21k.pth'

model = dict(
    backbone=dict(
        img_size=384,
        drop_rate=0.0,  # the official fine-tuning runs use no dropout
        init_cfg=dict(type='Pretrained', checkpoint=pretrained, prefix='backbone.'),
    ),
    # hidden_dim=None: no pre-logits layer; the head's Linear is initialised to zeros.
    head=dict(num_classes={{_base_.num_classes}}, hidden_dim=None),
)

max_steps = 500
# The paper's 500 warm-up steps would be the whole 500-step run here; we warm up for the first 10%
# and decay over the rest (a choice).
warmup_steps = 50
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-4, end_factor=1.0, by_epoch=False, begin=0, end=warmup_steps),
    dict(type='CosineAnnealingLR', eta_min=0.0, by_epoch=False, begin=warmup_steps, end=max_steps),
]
train_cfg = dict(max_iters=max_steps, val_interval=max_steps)
default_hooks = dict(logger=dict(interval=50), checkpoint=dict(interval=max_steps, max_keep_ckpts=1))

