# Supervised training of the tiny ViT on the digits from random initialisation: the baseline of the MPP
# experiment. vit_digits_ft-mpp.py is this config plus the MPP weights, so both arms share data,
# schedule and budget. Recipe: the demo's learning rate (configs/_base_/schedules/demo.py: AdamW 2e-3)
# in configs/_base_/schedules/adamw_cosine_iters.py (wd 0.05, warm-up, cosine, clip 1), counted in
# iterations so that runs of any length are comparable.
_base_ = [
    '../../../configs/_base_/datasets/digits.py',
    '../../../configs/_base_/default_runtime.py',
    '../../../configs/_base_/schedules/adamw_cosine_iters.py',
    './_tiny_vit.py',
]

model = dict(
    type='ImageClassifier',
    backbone={{_base_.backbone}},
    neck=None,
    # One linear layer, initialised to zero as the paper does for fine-tuning.
    head=dict(type='VisionTransformerClsHead', num_classes=10, in_channels=64,
              loss=dict(type='CrossEntropyLoss', loss_weight=1.0)),
)

train_dataloader = dict(sampler=dict(type='InfiniteSampler', shuffle=True))

max_iters = 500
warmup_iters = 50
optim_wrapper = dict(optimizer=dict(lr=2e-3))
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-3, by_epoch=False, begin=0, end=warmup_iters),
    dict(type='CosineAnnealingLR', eta_min=1e-5, by_epoch=False, begin=warmup_iters, end=max_iters),
]
train_cfg = dict(max_iters=max_iters, val_interval=100)
val_cfg = dict()
test_cfg = dict()
default_hooks = dict(logger=dict(interval=25),
                     checkpoint=dict(type='CheckpointHook', interval=max_iters, max_keep_ckpts=1))
