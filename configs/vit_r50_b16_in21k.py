# R50+ViT-B/16 hybrid (99M parameters), the ResNet-50 stem + ViT-B of the paper's Section 3.1.
# Pre-training on ImageNet-21k at 224 px with the paper's recipe (Adam, batch 4096, wd 0.03, dropout
# 0.1, 10k warm-up steps then linear decay, grad clip 1; Table 3). Train:
#   bash tools/dist_train.sh configs/vit_r50_b16_in21k.py 8   (batch 4096 via accumulation)
_base_ = [
    '_base_/models/vit_r50_b16.py',
    '_base_/datasets/imagenet21k.py',
    '_base_/schedules/vit_pretrain_in21k.py',
    '_base_/default_runtime.py',
]
model = dict(head=dict(num_classes={{_base_.num_classes}}))  # the class count of the dataset config
train_dataloader = dict(batch_size=64)  # per device; fits a 16 GB GPU in fp32 at 224 px
