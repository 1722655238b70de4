# ViT-L/16: paper Table 1, 24 layers, D=1024, MLP 4096, 16 heads (304,326,632 params at 1000 classes).
# Same recipe and head as _base_/models/vit_b16.py: a tanh pre-logits layer of width D at
# pre-training, replaced by a single zero-initialised linear layer for fine-tuning.
_base_ = ['./vit_b16.py']
model = dict(
    backbone=dict(arch='l', patch_size=16),
    head=dict(in_channels=1024, hidden_dim=1024),
)
