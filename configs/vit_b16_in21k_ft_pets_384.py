# ViT-B/16: ImageNet-21k -> Oxford-IIIT Pets at 384 px, with the paper's fine-tuning recipe
# (_base_/recipes/finetune_vit_b16_384.py): cosine decay, 500 steps (Table 4). The recipe's 500 warm-up
# steps would fill the whole run, so this config warms up for the first 50 steps instead (see
# `warmup_steps` below).
_base_ = ['_base_/recipes/finetune_vit_b16_384.py', '_base_/datasets/pets_384.py']

model = dict(head=dict(num_classes={{_base_.num_classes}}))

max_steps = 500
# The paper's 500 warm-up steps would be the whole 500-step run here; we warm up for the first 10%
# and decay over the rest (a choice).
warmup_steps = 50
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-4, end_factor=1.0, by_epoch=False, begin=0, end=warmup_steps),
    dict(type='CosineAnnealingLR', eta_min=0.0, by_epoch=False, begin=warmup_steps, end=max_steps),
]
train_cfg = dict(max_iters=max_steps, val_interval=max_steps)
default_hooks = dict(checkpoint=dict(interval=max_steps))
