# CIFAR-100 for fine-tuning at 384 px: data/cifar100/cifar-100-python/{train,test,meta}
# (downloaded by mmpretrain on first use). Same preprocessing as _base_/datasets/cifar10_384.py.
_base_ = ['./cifar10_384.py']
dataset_type = 'vit_plugin.CIFAR100'
data_root = 'data/cifar100'
num_classes = 100
data_preprocessor = dict(num_classes=num_classes)
train_dataloader = dict(dataset=dict(type=dataset_type, data_root=data_root, num_classes=num_classes))
val_dataloader = dict(dataset=dict(type=dataset_type, data_root=data_root, num_classes=num_classes))
test_dataloader = val_dataloader
