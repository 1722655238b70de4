# Masked patch prediction (the paper's objective: 50% of patch embeddings corrupted, 80/10/10, 3-bit
# mean colour of every corrupted patch) of exactly the shapes detector's ViT
# (configs/_base_/models/vit_tiny_shapes.py: windowed blocks and relative position bias included) on
# unlabelled shapes images: a split of its own, generated on first use with another seed than the
# labelled train/val images, so that no evaluation image is seen in pre-training. Fine-tuned by
# configs/mask_rcnn_vit_tiny_simplefpn_shapes_ft-mpp.py; the whole chain (with baselines, several seeds):
#   python projects/mpp_detection/run_chain.py
# Schedule: AdamW with warm-up and cosine decay as in the paper (_base_/schedules/adamw_cosine_iters.py),
# at a learning rate that suits a batch of 32 (not the paper's 2e-4 at batch 4096). 600 iterations (about 19 passes over the 1,024 images)
# took 8.6 min on 2 idle CPU cores, and the 24-epoch detector after it 3.9 min: the chain fits in the
# 20 minutes it was sized for. To change the length, change max_iters, the cosine's end and the
# checkpoint interval together (run_chain.py's --mpp-iters does).
_base_ = [
    './_base_/default_runtime.py',
    './_base_/schedules/adamw_cosine_iters.py',
    './_base_/models/vit_tiny_shapes.py',
]

img_size = 160  # the detector's input size (longest side) and its position table's grid x 8
model = dict(
    type='vit_plugin.MaskedPatchPrediction',
    data_preprocessor=dict(type='SelfSupDataPreprocessor', mean=[127.5] * 3, std=[127.5] * 3, to_rgb=True),
    backbone=_base_.backbone,
    head=dict(type='vit_plugin.MPPHead', in_channels=_base_.backbone.arch.embed_dims, target='mean_color_3bit',
              patch_size=_base_.backbone.patch_size),
    corrupt_ratio=0.5,
    mask_prob=0.8,
    random_prob=0.1,
)

train_dataloader = dict(
    batch_size=32,
    num_workers=2,
    persistent_workers=False,
    sampler=dict(type='InfiniteSampler', shuffle=True),
    collate_fn=dict(type='default_collate'),  # SelfSupDataPreprocessor takes a stacked batch
    dataset=dict(
        type='vit_plugin.ShapesUnlabelledDataset',
        data_root='data/shapes_coco/',  # next to the detector's train/ and val/
        split='unlabelled',
        num_images=1024,
        seed=1,  # the labelled splits use seed 0
        pipeline=[
            dict(type='vit_plugin.LoadImageFromFile'),
            # A fixed 160x160 input (the images are 96-160 px): crops of half to all of the image,
            # scaled up about as much as the detector's resize to a 160-px longest side scales them.
            dict(type='RandomResizedCrop', scale=img_size, crop_ratio_range=(0.5, 1.0)),
            dict(type='RandomFlip', prob=0.5, direction='horizontal'),  # as the detector's training
            dict(type='PackInputs'),
        ]),
)

max_iters = 600
warmup_iters = 60
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-3, by_epoch=False, begin=0, end=warmup_iters),
    dict(type='CosineAnnealingLR', eta_min=1e-5, by_epoch=False, begin=warmup_iters, end=max_iters),
]
train_cfg = dict(max_iters=max_iters)
val_cfg = test_cfg = None  # pre-training only
default_hooks = dict(logger=dict(interval=25), checkpoint=dict(interval=max_iters, max_keep_ckpts=1))
