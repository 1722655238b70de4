# ViT-L/16 (304M parameters): the paper's "Ours-I21k" model (85.30% ImageNet top-1 after fine-tuning).
# Pre-training on ImageNet-21k at 224 px with the paper's recipe (Adam, batch 4096, wd 0.03, dropout
# 0.1, 10k warm-up steps then linear decay, grad clip 1; Table 3). Train:
#   bash tools/dist_train.sh configs/vit_l16_in21k.py 8   (batch 4096 via accumulation)
_base_ = [
    '_base_/models/vit_l16.py',
    '_base_/datasets/imagenet21k.py',
    '_base_/schedules/vit_pretrain_in21k.py',
    '_base_/default_runtime.py',
]
model = dict(head=dict(num_classes={{_base_.num_classes}}))  # the class count of the dataset config
train_dataloader = dict(batch_size=32)  # per device; use --amp or --fsdp on GPUs below 32 GB
