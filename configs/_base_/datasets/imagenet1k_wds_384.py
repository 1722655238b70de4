# ImageNet-1k for fine-tuning at 384 px, from timm's WebDataset shards (1,281,167 training images in
# 1,024 shards, 50,000 validation images), read without extracting:
#   huggingface-cli download timm/imagenet-1k-wds --repo-type dataset --local-dir data/imagenet-1k-wds
# or data_root = 'hf://datasets/timm/imagenet-1k-wds'. Labels are the `.cls` values, the usual sorted
# synset order (mmpretrain's). The preprocessing is _base_/datasets/imagenet1k_384.py's.
_base_ = ['./imagenet1k_384.py']

dataset_type = 'vit_plugin.TarShardDataset'
data_root = 'data/imagenet-1k-wds'

train_dataloader = dict(
    sampler=dict(_delete_=True, type='vit_plugin.BlockShuffleSampler', block_size=256, mix_blocks=16),
    dataset=dict(_delete_=True, type=dataset_type, data_root=data_root, split='train', label=dict(source='cls'),
                 label_space='imagenet1k', num_classes={{_base_.num_classes}},
                 pipeline={{_base_.train_pipeline}}),
)
val_dataloader = dict(
    dataset=dict(_delete_=True, type=dataset_type, data_root=data_root, split='validation',
                 label=dict(source='cls'), label_space='imagenet1k', num_classes={{_base_.num_classes}},
                 pipeline={{_base_.test_pipeline}}),
)
test_dataloader = val_dataloader
