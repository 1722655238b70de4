# ViT-B/16: ImageNet-21k -> ImageNet-1k at 384 px, with the paper's fine-tuning recipe
# (_base_/recipes/finetune_vit_b16_384.py): 500 warm-up steps then cosine decay, 20000 steps (Table 4).
_base_ = ['_base_/recipes/finetune_vit_b16_384.py', '_base_/datasets/imagenet1k_384.py']

model = dict(head=dict(num_classes={{_base_.num_classes}}))

max_steps = 20000
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-4, end_factor=1.0, by_epoch=False, begin=0, end=500),
    dict(type='CosineAnnealingLR', eta_min=0.0, by_epoch=False, begin=500, end=max_steps),
]
train_cfg = dict(max_iters=max_steps, val_interval=max_steps)
default_hooks = dict(checkpoint=dict(interval=max_steps))

# Polyak averaging with factor 0.9999, as for the paper's ImageNet results (Section 4.1); validation
# and the saved checkpoint's 'ema_state_dict' use the averaged weights. tools/train.py sets the
# hook's interval to the accumulation factor so the average moves once per optimizer step.
custom_hooks = [dict(type='EMAHook', momentum=1e-4, priority='ABOVE_NORMAL')]
