# Faster R-CNN with the paper's ViT-B/16: our backbone, neck and optimiser
# (_base_/recipes/det_vit_b16.py, as in mask_rcnn_vit_b16_fpn_1x_coco.py) on mmdet's own Faster R-CNN
# 1x COCO recipe.
_base_ = ['mmdet::faster_rcnn/faster-rcnn_r50_fpn_1x_coco.py', './_base_/recipes/det_vit_b16.py']

model = dict(backbone=_base_._vit_backbone, data_preprocessor=_base_._vit_data_preprocessor,
             neck=_base_._vit_fpn_neck)
optim_wrapper = _base_._vit_optim_wrapper
default_hooks = _base_._guard_hooks
