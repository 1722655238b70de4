# Masked patch prediction on the digits' training split (labels unused): the paper's objective (50% of
# patch embeddings corrupted, 80/10/10, 3-bit mean colour of every corrupted patch) on the tiny ViT.
# With patch 4 on the 32-px digits every patch covers one pixel of the original 8x8 scan, so the task
# is inpainting the grey level of half of the digit's pixels from the other half. Schedule: AdamW with
# warm-up and cosine decay as in the paper (configs/_base_/schedules/adamw_cosine_iters.py), at a
# learning rate and length that suit 1,437 images and a batch of 64 (not the paper's 2e-4 at batch 4096).
#   python projects/masked_patch_prediction/run_experiment.py   (runs this, then the fine-tunings)
_base_ = [
    '../../../configs/_base_/default_runtime.py',
    '../../../configs/_base_/schedules/adamw_cosine_iters.py',
    './_tiny_vit.py',
]

model = dict(
    type='vit_plugin.MaskedPatchPrediction',
    data_preprocessor=dict(type='SelfSupDataPreprocessor', mean=[127.5] * 3, std=[127.5] * 3, to_rgb=True),
    backbone={{_base_.backbone}},
    head=dict(type='vit_plugin.MPPHead', in_channels=64, target='mean_color_3bit', patch_size=4),
    corrupt_ratio=0.5,
    mask_prob=0.8,
    random_prob=0.1,
)

train_dataloader = dict(
    batch_size=64,
    num_workers=2,
    persistent_workers=False,
    sampler=dict(type='InfiniteSampler', shuffle=True),
    collate_fn=dict(type='default_collate'),  # SelfSupDataPreprocessor takes a stacked batch
    dataset=dict(
        type='vit_plugin.DigitsDataset',
        data_root='data/digits',
        split='train',
        pipeline=[
            dict(type='vit_plugin.LoadImageFromFile'),
            # The demo's mild Inception crop; no flip (mirrored digits are other symbols).
            dict(type='RandomResizedCrop', scale=32, crop_ratio_range=(0.6, 1.0)),
            dict(type='PackInputs'),
        ]),
)

max_iters = 3000
warmup_iters = 200
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-3, by_epoch=False, begin=0, end=warmup_iters),
    dict(type='CosineAnnealingLR', eta_min=1e-5, by_epoch=False, begin=warmup_iters, end=max_iters),
]
train_cfg = dict(max_iters=max_iters)
val_cfg = test_cfg = None  # pre-training only
default_hooks = dict(logger=dict(interval=25),
                     checkpoint=dict(type='CheckpointHook', interval=max_iters, max_keep_ckpts=1))
