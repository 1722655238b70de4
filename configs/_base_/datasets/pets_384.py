# Oxford-IIIT Pets (37 classes) for fine-tuning at 384 px; the official archives unpacked into
#   data/oxford-iiit-pet/images/*.jpg and data/oxford-iiit-pet/annotations/{trainval,test}.txt
# Train on `trainval` (3,680 images), evaluate on `test` (3,669), the standard protocol.
_base_ = ['./imagenet1k_384.py']
dataset_type = 'vit_plugin.OxfordIIITPet'
data_root = 'data/oxford-iiit-pet'
num_classes = 37
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
