# ImageNet-21k winter21 (19,167 classes) for pre-training, from timm's WebDataset shards:
#   huggingface-cli download timm/imagenet-w21-wds --repo-type dataset --local-dir data/imagenet-w21-wds
# (timm/imagenet-w21-webp-wds holds the same images as WebP, 1,024 shards: set data_root to it; the
# loaders decode WebP as well). Labels are the shards' `.cls` values. No synset list of winter21 ships
# with any package, so the classes have no names; `label=dict(source='synset')` instead numbers the
# sorted synsets of the shards' keys and names the classes by them (docs/data.md#label-spaces).
_base_ = ['./imagenet21k_wds.py']

data_root = 'data/imagenet-w21-wds'
num_classes = 19167

data_preprocessor = dict(num_classes=num_classes)

train_dataloader = dict(
    dataset=dict(data_root=data_root, label_space=None, num_classes=num_classes),
)
