# ViT-B/16: ImageNet-21k -> CIFAR-10 at 384 px, with the paper's fine-tuning recipe
# (_base_/recipes/finetune_vit_b16_384.py): 500 warm-up steps then cosine decay, 10000 steps (Table 4).
_base_ = ['_base_/recipes/finetune_vit_b16_384.py', '_base_/datasets/cifar10_384.py']

model = dict(head=dict(num_classes={{_base_.num_classes}}))

max_steps = 10000
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-4, end_factor=1.0, by_epoch=False, begin=0, end=500),
    dict(type='CosineAnnealingLR', eta_min=0.0, by_epoch=False, begin=500, end=max_steps),
]
train_cfg = dict(max_iters=max_steps, val_interval=max_steps)
default_hooks = dict(checkpoint=dict(interval=max_steps))
