# ViT-B/32 (88M parameters; 49 patches per image, 4.4x cheaper than B/16).
# Pre-training on ImageNet-21k at 224 px with the paper's recipe (Adam, batch 4096, wd 0.03, dropout
# 0.1, 10k warm-up steps then linear decay, grad clip 1; Table 3). Train:
#   bash tools/dist_train.sh configs/vit_b32_in21k.py 8   (batch 4096 via accumulation)
_base_ = [
    '_base_/models/vit_b32.py',
    '_base_/datasets/imagenet21k.py',
    '_base_/schedules/vit_pretrain_in21k.py',
    '_base_/default_runtime.py',
]
model = dict(head=dict(num_classes={{_base_.num_classes}}))  # the class count of the dataset config
train_dataloader = dict(batch_size=128)  # per device; fits a 16 GB GPU in fp32 at 224 px
