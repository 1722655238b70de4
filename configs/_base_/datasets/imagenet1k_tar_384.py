# ImageNet-1k for fine-tuning at 384 px, training images read straight from image-net.org's
# ILSVRC2012_img_train.tar (a tar of 1,000 per-class tars, 138 GB), without extracting it:
#   data/imagenet/ILSVRC2012_img_train.tar
#   data/imagenet/val/... and data/imagenet/meta/val.txt   (the validation folder, as mmpretrain has it)
# Classes are the synsets of the inner tars in sorted order (mmpretrain's order). For the validation
# images as timm's shards instead, take val_dataloader from _base_/datasets/imagenet1k_wds_384.py.
_base_ = ['./imagenet1k_384.py']

data_root = 'data/imagenet'

train_dataloader = dict(
    # The inner tars hold one class each: small blocks (16 neighbours), 256 of them mixed per 4,096
    # samples, so that every batch still draws from many classes.
    sampler=dict(_delete_=True, type='vit_plugin.BlockShuffleSampler', block_size=16, mix_blocks=256),
    dataset=dict(_delete_=True, type='vit_plugin.TarShardDataset', data_root=data_root,
                 shards='ILSVRC2012_img_train.tar', split=None, layout='tar_of_tars',
                 label=dict(source='synset'), label_space='imagenet1k', num_classes={{_base_.num_classes}},
                 pipeline={{_base_.train_pipeline}}),
)
