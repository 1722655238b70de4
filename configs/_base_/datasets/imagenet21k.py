# ImageNet-21k for pre-training, list-file layout (recommended: no directory scan of 14M files):
#   data/imagenet21k/meta/train.txt   one "<path relative to train/> <label>" per line
#   data/imagenet21k/train/...        the images (any sub-folder structure, e.g. <wnid>/<name>.JPEG)
# For the one-folder-per-class layout use _base_/datasets/imagenet21k_folder.py.
# Preprocessing of the paper (Section 4.1 / Appendix B): Inception crop + horizontal flip at 224 px,
# pixels scaled to [-1, 1].
dataset_type = 'vit_plugin.ImageNet21k'
data_root = 'data/imagenet21k'
# The official 2020 release (fall11). Set it to the number of classes of your list: the dataset checks every
# label against it when it indexes the list, and the data preprocessor and (in the model configs) the
# head take it from here.
num_classes = 21843

data_preprocessor = dict(
    num_classes=num_classes,
    mean=[127.5, 127.5, 127.5],  # (x - 127.5) / 127.5 maps 0..255 to [-1, 1]
    std=[127.5, 127.5, 127.5],
    to_rgb=True,  # images are decoded as BGR
)

train_pipeline = [
    # Inception crop: a random 5%-100% area and 3/4-4/3 aspect-ratio box resized to 224, as in the
    # official input pipeline (TF sample_distorted_bounding_box with area_range=(0.05, 1)).
    # LoadImageFromFile + RandomResizedCrop in one step, with the same boxes (and pixels), except that
    # a JPEG crop of at least 448 px is decoded at reduced DCT scale (faster on large photos).
    dict(type='vit_plugin.LoadAndInceptionCrop', scale=224, crop_ratio_range=(0.05, 1.0)),
    dict(type='RandomFlip', prob=0.5, direction='horizontal'),
    dict(type='PackInputs'),
]

train_dataloader = dict(
    batch_size=64,  # per device; the schedule's global_batch_size (4096) is reached by accumulation
    num_workers=8,
    persistent_workers=True,
    sampler=dict(type='InfiniteSampler', shuffle=True),
    dataset=dict(
        type=dataset_type,
        data_root=data_root,
        ann_file='meta/train.txt',
        data_prefix='train',
        num_classes=num_classes,  # labels outside [0, num_classes) stop the run at start-up
        pipeline=train_pipeline,
    ),
)
# No official validation split: validation is off. To monitor a held-out list (e.g. 10 images per
# class moved out of train.txt into meta/val.txt), add val_dataloader/val_evaluator/val_cfg like
# _base_/datasets/imagenet1k_384.py does.
val_dataloader = None
val_evaluator = None
test_dataloader = None
test_evaluator = None
