# The ViT of the MPP study on the embedded digits: 32x32 images, patch 4 (an 8x8 grid of 64 patch
# tokens plus the class token; each patch covers one pixel of the original 8x8 scan, so MPP inpaints
# missing pixels of the digit from the visible ones), width 64, 4 blocks, 4 heads. Much smaller than
# configs/_base_/models/vit_demo.py so that every pre-training and fine-tuning run of the study takes
# minutes on a 2-core CPU; otherwise the paper's ViT.
# The encoder's shape in mmpretrain's keys (feedforward_channels = our mlp_dims), so that the MAE and
# MaskFeat configs build mmpretrain's encoders from this one definition.
encoder_arch = dict(embed_dims=64, num_layers=4, num_heads=4, feedforward_channels=128)
backbone = dict(
    type='vit_plugin.ViT',
    arch=encoder_arch,
    img_size=32,
    patch_size=4,
    drop_rate=0.,
)
