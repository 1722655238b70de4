# ViT-H/14: paper Table 1, 32 layers, D=1280, MLP 5120, 16 heads (632,045,800 params at 1000 classes).
# Same recipe and head as _base_/models/vit_b16.py: a tanh pre-logits layer of width D at
# pre-training, replaced by a single zero-initialised linear layer for fine-tuning.
_base_ = ['./vit_b16.py']
model = dict(
    backbone=dict(arch='h', patch_size=14),
    head=dict(in_channels=1280, hidden_dim=1280),
)
