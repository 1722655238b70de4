# ViT-Ti/16: not in the paper (DeiT/AugReg size), 12 layers, D=192, MLP 768, 3 heads.
# Same recipe and head as _base_/models/vit_b16.py: a tanh pre-logits layer of width D at
# pre-training, replaced by a single zero-initialised linear layer for fine-tuning.
_base_ = ['./vit_b16.py']
model = dict(
    backbone=dict(arch='ti', patch_size=16),
    head=dict(in_channels=192, hidden_dim=192),
)
