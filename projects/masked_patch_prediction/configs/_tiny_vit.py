# The ViT of the MPP experiment on the embedded digits: 32x32 images, patch 8 (a 4x4 grid of 16 patch
# tokens plus the class token; each patch covers 2x2 pixels of the original 8x8 scan), width 64, 4
# blocks. Much smaller than configs/_base_/models/vit_demo.py so that pre-training plus the fine-tuning
# runs fit in minutes on a shared 2-core CPU; otherwise the paper's ViT.
backbone = dict(
    type='vit_plugin.ViT',
    arch=dict(embed_dims=64, num_layers=4, num_heads=4, mlp_dims=128),
    img_size=32,
    patch_size=8,
    drop_rate=0.,
)
