# ViTDet-style Mask R-CNN (Li et al., ECCV 2022) with the paper's ViT-B/16: only the last block's
# stride-16 map is used, a simple feature pyramid (deconvolutions / identity / pooling, LayerNorm over
# channels) makes strides 4-64 from it, and most blocks attend within 14x14-patch windows (blocks 2,
# 5, 8, 11 stay global), which keeps memory and time near-linear in the image area; every block adds
# ViTDet's decomposed relative position bias (tables start at zero: the checkpoint has none). The rest
# is mmdet's own Mask R-CNN 1x COCO recipe; the ViT, its checkpoint and the optimiser (layer decay 0.7,
# ViTDet's value for ViT-B) come from _base_/recipes/det_vit_b16.py.
_base_ = ['mmdet::mask_rcnn/mask-rcnn_r50_fpn_1x_coco.py', './_base_/recipes/det_vit_b16.py']

# window_block_indices=None: ViTDet's rule for any depth, the last block of each of 4 stages (as equal
# as possible) stays global, the others are windowed: blocks 2, 5, 8, 11 of 'b', 5, 11, 17, 23 of 'l',
# 7, 15, 23, 31 of 'h'; with 4 or fewer blocks none is windowed (a warning says so).
model = dict(
    backbone=dict(_base_._vit_backbone, out_indices=-1, window_size=14, window_block_indices=None,
                  use_rel_pos=True),
    data_preprocessor=_base_._vit_data_preprocessor,
    neck=dict(_delete_=True, type='vit_plugin.SimpleFeaturePyramid', in_channels=_base_.embed_dims, out_channels=256,
              scale_factors=(4.0, 2.0, 1.0, 0.5), num_outs=5))
optim_wrapper = _base_._vit_optim_wrapper
default_hooks = _base_._guard_hooks
