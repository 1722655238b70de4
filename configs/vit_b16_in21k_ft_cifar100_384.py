# ViT-B/16: ImageNet-21k -> CIFAR-100 at 384 px: the CIFAR-10 recipe (same schedule, 10000 steps,
# Table 4) on CIFAR-100 (data/cifar100/cifar-100-python/, downloaded by mmpretrain on first use).
_base_ = ['./vit_b16_in21k_ft_cifar10_384.py']

dataset_type = 'vit_plugin.CIFAR100'
data_root = 'data/cifar100'
num_classes = 100
data_preprocessor = dict(num_classes=num_classes)
model = dict(head=dict(num_classes=num_classes))
train_dataloader = dict(dataset=dict(type=dataset_type, data_root=data_root, num_classes=num_classes))
val_dataloader = dict(dataset=dict(type=dataset_type, data_root=data_root, num_classes=num_classes))
test_dataloader = val_dataloader
