# The ViT of the shapes detector (configs/mask_rcnn_vit_tiny_simplefpn_shapes.py): 4 blocks, 96 wide, on
# 8x8 patches of 160x160 inputs (a 20x20 grid), blocks 0 and 2 attending within 5x5-patch windows,
# ViTDet's relative position bias everywhere. The detector and its masked-patch-prediction pre-training
# (configs/mpp_vit_tiny_shapes.py) both take the backbone from here, so the pre-trained weights always
# fit the detector. Each adds what only it needs (the detector: out_type='featmap', init_cfg).
backbone = dict(
    type='vit_plugin.ViT',
    arch=dict(embed_dims=96, num_layers=4, num_heads=3, mlp_dims=384),
    patch_size=8,
    img_size=(160, 160),
    drop_path_rate=0.,
    window_size=5,
    window_block_indices=(0, 2),
    use_rel_pos=True,  # ViTDet's decomposed relative position bias in every block
)
