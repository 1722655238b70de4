# ImageNet-21k (fall11: 21,841 classes, 13,673,551 training images) for pre-training, read straight
# from timm's WebDataset shards, without extracting anything:
#   huggingface-cli download timm/imagenet-22k-wds --repo-type dataset --local-dir data/imagenet-22k-wds
# or stream them: data_root = 'hf://datasets/timm/imagenet-22k-wds' (after `huggingface-cli login`;
# the shards go through a bounded chunk cache under ~/.cache/vit_plugin/shards). Index them once ahead of
# training, into a place every node reads: `python tools/build_index.py CONFIG`
# (resumable; otherwise the first run builds it, one process for the whole job; docs/data.md#the-index).
# Labels are the shards' `.cls` values, timm's fall11 order (sorted synsets). The paper's checkpoints use
# Google's 21,843-class order: label_space/target_label_space and the head mapping of
# docs/checkpoints.md#label-spaces go between the two.
_base_ = ['./imagenet21k.py']  # the paper's preprocessing: Inception crop + flip at 224, [-1, 1]

dataset_type = 'vit_plugin.TarShardDataset'
data_root = 'data/imagenet-22k-wds'
num_classes = 21841

data_preprocessor = dict(num_classes=num_classes)

train_dataloader = dict(
    # Exact epochs; the order is a pure function of (seed, epoch); blocks of 256 neighbours of a shard
    # (timm's shards are written in random order), 16 blocks mixed per 4,096 samples; --resume skips in it.
    sampler=dict(_delete_=True, type='vit_plugin.BlockShuffleSampler', block_size=256, mix_blocks=16),
    dataset=dict(
        _delete_=True,
        type=dataset_type,
        data_root=data_root,
        split='train',  # the shards of _info.json's 'train' split, else imagenet22k-train-*.tar
        label=dict(source='cls'),
        label_space='fall11',
        num_classes=num_classes,
        pipeline={{_base_.train_pipeline}},
    ),
)
