# RetinaNet with the paper's ViT-B/16 (_base_/recipes/det_vit_b16.py) on mmdet's own RetinaNet 1x COCO
# recipe. RetinaNet's pyramid starts at stride 8, so three blocks are rescaled (2x, 1x, 0.5x) for
# mmdet's FPN. Use out_indices=(11, 17, 23) for a 24-block arch ('l').
_base_ = ['mmdet::retinanet/retinanet_r50_fpn_1x_coco.py', './_base_/recipes/det_vit_b16.py']

embed_dims = _base_.embed_dims
model = dict(
    backbone=dict(_base_._vit_backbone, out_indices=(5, 8, 11)),
    data_preprocessor=_base_._vit_data_preprocessor,
    neck=[
        dict(type='vit_plugin.SimpleFeaturePyramid', in_channels=embed_dims, out_channels=None,
             scale_factors=(2.0, 1.0, 0.5)),
        # strides 8, 16, 32 from the three blocks, then 64 and 128 by mmdet's extra convolutions
        dict(type='FPN', in_channels=[embed_dims // 2, embed_dims, embed_dims], out_channels=256, start_level=0,
             add_extra_convs='on_input', num_outs=5),
    ])
optim_wrapper = _base_._vit_optim_wrapper
default_hooks = _base_._guard_hooks
