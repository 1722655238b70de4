# The embedded demo (`make demo`): a small ViT trained from scratch on scikit-learn's handwritten
# digits (prepared automatically under data/digits) in a few minutes on 2 CPU cores.
#   python tools/train.py configs/vit_demo_digits.py
_base_ = [
    '_base_/models/vit_demo.py',
    '_base_/datasets/digits.py',
    '_base_/schedules/demo.py',
    '_base_/default_runtime.py',
]
model = dict(head=dict(num_classes={{_base_.num_classes}}))  # the class count of the dataset config
default_hooks = dict(
    logger=dict(interval=10),
    checkpoint=dict(by_epoch=True, interval=5, max_keep_ckpts=2),
)
