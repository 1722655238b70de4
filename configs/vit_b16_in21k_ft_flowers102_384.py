# ViT-B/16: ImageNet-21k -> Oxford Flowers-102 at 384 px: the Pets recipe (500 steps with 50 warm-up
# steps, Table 4) on Flowers-102 (data/flowers102/, see _base_/datasets/flowers102_384.py; trained on
# train+val, a choice).
_base_ = ['./vit_b16_in21k_ft_pets_384.py']

dataset_type = 'vit_plugin.Flowers102'
data_root = 'data/flowers102'
num_classes = 102
data_preprocessor = dict(num_classes=num_classes)
model = dict(head=dict(num_classes=num_classes))
train_dataloader = dict(dataset=dict(type=dataset_type, data_root=data_root, num_classes=num_classes))
val_dataloader = dict(dataset=dict(type=dataset_type, data_root=data_root, num_classes=num_classes))
test_dataloader = val_dataloader
