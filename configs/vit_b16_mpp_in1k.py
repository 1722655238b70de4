# Masked patch prediction pre-training of ViT-B/16 on ImageNet-1k with the paper's recipe (Appendix
# B.1.2): Adam, base lr 2e-4 at batch 4096, 10k warm-up steps then cosine decay, inception crop + flip;
# target: the 3-bit mean colour of every corrupted patch. The paper ran 1M steps on JFT, saw
# diminishing returns after 100k steps and similar gains when pre-training on ImageNet, hence 100k
# steps here (about 320 ImageNet epochs at batch 4096). Variants: vit_b16_mpp_in1k_4x4.py (4x4
# downsized patch, 16 x 512-way), vit_b16_mpp_in1k_l2.py (L2 on the pixels). Fine-tune the result
# with vit_b16_mpp-ft_in1k-384.py.
#
#   bash tools/dist_train.sh configs/vit_b16_mpp_in1k.py 8   (batch 4096 via accumulation)
_base_ = ['./_base_/models/mpp_vit_b16.py', './_base_/default_runtime.py']

# Counted in optimizer steps at the global batch of 4096, which tools/train.py reaches on any number
# of devices by gradient accumulation (see _base_/schedules/vit_pretrain_in21k.py);
# `--cfg-options global_batch_size=None --auto-scale-lr` trains with the batch you have instead.
global_batch_size = 4096
auto_scale_lr = dict(base_batch_size=4096, enable=False)
max_steps = 100_000
warmup_steps = 10_000

train_pipeline = [
    dict(type='vit_plugin.LoadImageFromFile'),  # mmcv's, with checked decoding (named errors, size limit)
    # Inception crop (8%-100% of the area, aspect ratio 3/4-4/3) and horizontal flip.
    dict(type='RandomResizedCrop', scale=224, backend='pillow', interpolation='bicubic'),
    dict(type='RandomFlip', prob=0.5, direction='horizontal'),
    dict(type='PackInputs'),
]
train_dataloader = dict(
    batch_size=64,  # per device
    num_workers=8,
    persistent_workers=True,
    sampler=dict(type='InfiniteSampler', shuffle=True),
    # SelfSupDataPreprocessor takes a stacked batch (a dict), not mmengine's pseudo_collate list.
    collate_fn=dict(type='default_collate'),
    dataset=dict(type='vit_plugin.ImageNet', data_root='data/imagenet', split='train', pipeline=train_pipeline),
)

# The paper names Adam without a weight decay for MPP; we keep the 0.1 of its JFT pre-training, applied
# decoupled (AdamW), the way the official Flax optimiser applies weight decay. Gradients are clipped at
# global norm 1 as in all of the paper's pre-training.
optim_wrapper = dict(
    type='vit_plugin.GuardedOptimWrapper',  # drops NaN/inf updates (docs/configs.md)
    optimizer=dict(type='AdamW', lr=2e-4, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.1),
    clip_grad=dict(max_norm=1.0),
)
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-4, end_factor=1.0, by_epoch=False, begin=0, end=warmup_steps),
    dict(type='CosineAnnealingLR', eta_min=0., by_epoch=False, begin=warmup_steps, end=max_steps),
]
train_cfg = dict(type='vit_plugin.IterBasedTrainLoop', max_iters=max_steps)
val_cfg = None
test_cfg = None

default_hooks = dict(
    logger=dict(type='LoggerHook', interval=100),
    checkpoint=dict(type='CheckpointHook', by_epoch=False, interval=10_000, max_keep_ckpts=3),
)
log_processor = dict(by_epoch=False)
