# ViT-B/32: paper Table 1, 12 layers, D=768, MLP 3072, 12 heads (88,224,232 params at 1000 classes).
# Same recipe and head as _base_/models/vit_b16.py: a tanh pre-logits layer of width D at
# pre-training, replaced by a single zero-initialised linear layer for fine-tuning.
_base_ = ['./vit_b16.py']
model = dict(
    backbone=dict(arch='b', patch_size=32),
    head=dict(in_channels=768, hidden_dim=768),
)
