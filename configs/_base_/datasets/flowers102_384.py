# Oxford Flowers-102 for fine-tuning at 384 px; the official files in
#   data/flowers102/jpg/*.jpg, data/flowers102/imagelabels.mat, data/flowers102/setid.mat
# Train on train+val (2,040 images; the paper does not say which split, a choice), evaluate on the
# 6,149 test images. Reading the .mat files needs scipy.
_base_ = ['./imagenet1k_384.py']
dataset_type = 'vit_plugin.Flowers102'
data_root = 'data/flowers102'
num_classes = 102
data_preprocessor = dict(num_classes=num_classes)
train_dataloader = dict(dataset=dict(_delete_=True, type=dataset_type, data_root=data_root, split='trainval',
                                     num_classes=num_classes,
                                     pipeline={{_base_.train_pipeline}}))
val_dataloader = dict(dataset=dict(_delete_=True, type=dataset_type, data_root=data_root, split='test',
                                   num_classes=num_classes,
                                   pipeline={{_base_.test_pipeline}}))
val_evaluator = dict(type='Accuracy', topk=(1, ))
test_dataloader = val_dataloader
test_evaluator = val_evaluator
