# CIFAR-10 for fine-tuning at 384 px. mmpretrain reads the python version,
#   data/cifar10/cifar-10-batches-py/{data_batch_1..5,test_batch,batches.meta}
# and downloads it there on first use (download=True); set download=False on offline machines.
# The 32 px images are upsampled to 384 as in the paper (Inception crop + flip for training, plain
# resize for evaluation). Pixels to [-1, 1]; CIFAR arrays are already RGB (to_rgb=False).
dataset_type = 'vit_plugin.CIFAR10'
data_root = 'data/cifar10'
img_size = 384
num_classes = 10

data_preprocessor = dict(
    num_classes=num_classes,
    mean=[127.5, 127.5, 127.5],
    std=[127.5, 127.5, 127.5],
    to_rgb=False,
)

train_pipeline = [
    dict(type='RandomResizedCrop', scale=img_size, crop_ratio_range=(0.05, 1.0)),
    dict(type='RandomFlip', prob=0.5, direction='horizontal'),
    dict(type='PackInputs'),
]
test_pipeline = [
    dict(type='Resize', scale=(img_size, img_size)),
    dict(type='PackInputs'),
]

train_dataloader = dict(
    batch_size=32,
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
    dataset=dict(type=dataset_type, data_root=data_root, split='test', num_classes=num_classes,
                 pipeline=test_pipeline),
)
val_evaluator = dict(type='Accuracy', topk=(1, ))
test_dataloader = val_dataloader
test_evaluator = val_evaluator
