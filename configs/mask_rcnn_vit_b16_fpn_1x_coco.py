# Mask R-CNN with the paper's ViT-B/16 instead of ResNet-50: everything but the backbone/neck (and
# the optimiser that suits a ViT) is mmdet's own 1x COCO recipe, inherited unchanged. The ViT parts,
# and the lines to change for another ViT or checkpoint, are in _base_/recipes/det_vit_b16.py.
_base_ = ['mmdet::mask_rcnn/mask-rcnn_r50_fpn_1x_coco.py', './_base_/recipes/det_vit_b16.py']

model = dict(backbone=_base_._vit_backbone, data_preprocessor=_base_._vit_data_preprocessor,
             neck=_base_._vit_fpn_neck)
optim_wrapper = _base_._vit_optim_wrapper
default_hooks = _base_._guard_hooks
