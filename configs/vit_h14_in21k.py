# ViT-H/14 (632M parameters). The paper pre-trains H/14 only on JFT; these are its ImageNet-21k
# hyper-parameters for B and L (a choice; the official 2020 release has an in21k H/14 too).
# Pre-training on ImageNet-21k at 224 px with the paper's recipe (Adam, batch 4096, wd 0.03, dropout
# 0.1, 10k warm-up steps then linear decay, grad clip 1; Table 3). Train:
#   bash tools/dist_train.sh configs/vit_h14_in21k.py 8   (batch 4096 via accumulation)
_base_ = [
    '_base_/models/vit_h14.py',
    '_base_/datasets/imagenet21k.py',
    '_base_/schedules/vit_pretrain_in21k.py',
    '_base_/default_runtime.py',
]
model = dict(head=dict(num_classes={{_base_.num_classes}}))  # the class count of the dataset config
# Per device. Train with --fsdp (parameters, gradients and optimizer state sharded across GPUs) and --amp.
train_dataloader = dict(batch_size=16)
