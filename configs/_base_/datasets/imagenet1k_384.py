# ImageNet-1k (ILSVRC-2012) for fine-tuning at 384 px. mmpretrain's layout:
#   data/imagenet/train/<wnid>/*.JPEG, data/imagenet/val/*.JPEG (flat) with
#   data/imagenet/meta/{train,val}.txt ("<relative path> <label>" per line)
# Training: Inception crop + flip at 384; evaluation: resize to 384x384 (no crop), as the official
# fine-tuning code does. Pixels to [-1, 1].
dataset_type = 'vit_plugin.ImageNet'
data_root = 'data/imagenet'
img_size = 384
num_classes = 1000  # the dataset checks its labels against it; the head takes it from here too

data_preprocessor = dict(
    num_classes=num_classes,
    mean=[127.5, 127.5, 127.5],
    std=[127.5, 127.5, 127.5],
    to_rgb=True,
)

train_pipeline = [
    dict(type='vit_plugin.LoadImageFromFile'),  # mmcv's, with checked decoding (named errors, size limit)
    dict(type='RandomResizedCrop', scale=img_size, crop_ratio_range=(0.05, 1.0)),
    dict(type='RandomFlip', prob=0.5, direction='horizontal'),
    dict(type='PackInputs'),
]
test_pipeline = [
    dict(type='vit_plugin.LoadImageFromFile'),
    dict(type='Resize', scale=(img_size, img_size)),
    dict(type='PackInputs'),
]

train_dataloader = dict(
    batch_size=32,  # per device; global batch 512 by accumulation (see the schedule)
    num_workers=8,
    persistent_workers=True,
    sampler=dict(type='InfiniteSampler', shuffle=True),
    dataset=dict(type=dataset_type, data_root=data_root, split='train', num_classes=num_classes,
                 pipeline=train_pipeline),
)
val_dataloader = dict(
    batch_size=64,
    num_workers=8,
    persistent_workers=True,
    sampler=dict(type='DefaultSampler', shuffle=False),
    dataset=dict(type=dataset_type, data_root=data_root, split='val', num_classes=num_classes,
                 pipeline=test_pipeline),
)
val_evaluator = dict(type='Accuracy', topk=(1, 5))
test_dataloader = val_dataloader
test_evaluator = val_evaluator
