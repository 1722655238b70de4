# The embedded demo dataset: scikit-learn's handwritten digits (10 classes, 1,438 train / 359 test
# images), written on first use as 32x32 PNGs into data/digits/{train,test}/<class>/<n>.png
# (vit_plugin/datasets/digits.py). No download needed.
dataset_type = 'vit_plugin.DigitsDataset'
data_root = 'data/digits'

num_classes = 10

data_preprocessor = dict(
    num_classes=num_classes,
    mean=[127.5, 127.5, 127.5],  # pixels to [-1, 1], as in the paper
    std=[127.5, 127.5, 127.5],
    to_rgb=True,
)

train_pipeline = [
    dict(type='vit_plugin.LoadImageFromFile'),
    # A mild Inception crop. No flip: mirrored digits are different symbols.
    dict(type='RandomResizedCrop', scale=32, crop_ratio_range=(0.6, 1.0)),
    dict(type='PackInputs'),
]
test_pipeline = [
    dict(type='vit_plugin.LoadImageFromFile'),
    dict(type='PackInputs'),
]

train_dataloader = dict(
    batch_size=64,
    num_workers=2,
    persistent_workers=False,  # reseeded workers each epoch: `--resume` reproduces the run exactly
    sampler=dict(type='DefaultSampler', shuffle=True),
    dataset=dict(type=dataset_type, data_root=data_root, split='train', num_classes=num_classes,
                 pipeline=train_pipeline),
)
val_dataloader = dict(
    batch_size=128,
    num_workers=2,
    persistent_workers=False,
    sampler=dict(type='DefaultSampler', shuffle=False),
    dataset=dict(type=dataset_type, data_root=data_root, split='test', num_classes=num_classes,
                 pipeline=test_pipeline),
)
val_evaluator = dict(type='Accuracy', topk=(1, ))
test_dataloader = val_dataloader
test_evaluator = val_evaluator
