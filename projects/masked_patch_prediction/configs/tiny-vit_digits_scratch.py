# Supervised training of the tiny ViT on the digits from random initialisation: the baseline of the MPP
# experiment. vit_digits_ft-mpp.py is this config plus the MPP weights, so both arms share data,
# schedule and budget. Recipe: the demo's (configs/_base_/schedules/demo.py: AdamW 2e-3, wd 0.05,
# warm-up, cosine, clip 1), counted in iterations so that runs of any length are comparable.
_base_ = [
    '../../../configs/_base_/datasets/digits.py',
    '../../../configs/_base_/default_runtime.py',
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
optim_wrapper = dict(
    type='OptimWrapper',
    optimizer=dict(type='AdamW', lr=2e-3, betas=(0.9, 0.999), weight_decay=0.05),
    clip_grad=dict(max_norm=1.0),
)
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-3, by_epoch=False, begin=0, end=warmup_iters),
    dict(type='CosineAnnealingLR', eta_min=1e-5, by_epoch=False, begin=warmup_iters, end=max_iters),
]
train_cfg = dict(type='IterBasedTrainLoop', max_iters=max_iters, val_interval=100)
val_cfg = dict()
test_cfg = dict()

default_hooks = dict(
    logger=dict(type='LoggerHook', interval=25),
    checkpoint=dict(type='CheckpointHook', by_epoch=False, interval=max_iters, max_keep_ckpts=1),
)
log_processor = dict(by_epoch=False)
