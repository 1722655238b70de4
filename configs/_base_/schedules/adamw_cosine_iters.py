# AdamW (betas 0.9 / 0.999, weight decay 0.05, gradient clipping at global norm 1) with a linear
# warm-up from 1e-3 of the learning rate and a cosine decay to 1e-5, counted in iterations: the
# paper's pre-training optimiser family at the small scale of the MPP runs on the shapes
# (configs/mpp_vit_tiny_shapes.py) and of the MPP study on the digits (projects/masked_patch_prediction).
#
# A config sets its learning rate and its length. mmengine evaluates this file before the config that
# inherits it, so a config with another length restates what counts to it:
#     max_iters, warmup_iters = 3000, 200
#     param_scheduler = [... the two schedulers below, with end=warmup_iters / end=max_iters ...]
#     train_cfg = dict(max_iters=max_iters)
#     default_hooks = dict(checkpoint=dict(interval=max_iters, max_keep_ckpts=1))
max_iters = 1000
warmup_iters = 100
optim_wrapper = dict(
    type='vit_plugin.GuardedOptimWrapper',  # drops NaN/inf updates (docs/configs.md)
    optimizer=dict(type='AdamW', lr=1e-3, betas=(0.9, 0.999), weight_decay=0.05),
    clip_grad=dict(max_norm=1.0),
)
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-3, by_epoch=False, begin=0, end=warmup_iters),
    dict(type='CosineAnnealingLR', eta_min=1e-5, by_epoch=False, begin=warmup_iters, end=max_iters),
]
train_cfg = dict(type='vit_plugin.IterBasedTrainLoop', max_iters=max_iters)
log_processor = dict(by_epoch=False)
