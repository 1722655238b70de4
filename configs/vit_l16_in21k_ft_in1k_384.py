# ViT-L/16: ImageNet-21k -> ImageNet-1k at 384 px: the ViT-B/16 recipe of vit_b16_in21k_ft_in1k_384.py
# (SGD, batch 512, 20000 steps, Polyak averaging 0.9999) with the large model. The paper's Table 2
# reports 85.30% top-1 for this model fine-tuned at 512 px; set img_size=512 and the pipelines' 384
# to match.
_base_ = ['./vit_b16_in21k_ft_in1k_384.py']

# Your pre-trained weights: a runner checkpoint of configs/vit_l16_in21k.py, or an official .npz / its
# conversion by tools/convert_checkpoint.py (whole classifiers: prefix='backbone.' may stay or go, see
# vit_b16_in21k_ft_in1k_384.py).
pretrained = 'checkpoints/vit_l16_in21k.pth'

model = dict(
    backbone=dict(arch='l', init_cfg=dict(checkpoint=pretrained)),
    head=dict(in_channels=1024),
)
train_dataloader = dict(batch_size=16)  # per device; global batch 512 by accumulation
