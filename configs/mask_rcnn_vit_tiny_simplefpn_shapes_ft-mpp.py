# The shapes detector (mask_rcnn_vit_tiny_simplefpn_shapes.py, mmdet's Mask R-CNN) with its ViT
# initialised from masked patch prediction on unlabelled shapes images (configs/mpp_vit_tiny_shapes.py):
# prefix 'backbone.' loads the encoder only (the [mask] embedding and the MPP head stay behind); the
# pyramid and the heads start fresh. Pre-training and detector share img_size, so the position table
# loads as it is; the backbone resizes it on the fly to each padded batch. Pre-train first, then point
# `checkpoint` at the result (projects/mpp_detection/run_chain.py does both):
#   python tools/train.py configs/mpp_vit_tiny_shapes.py --work-dir work_dirs/mpp_vit_tiny_shapes
_base_ = './mask_rcnn_vit_tiny_simplefpn_shapes.py'

model = dict(backbone=dict(init_cfg=dict(_delete_=True, type='Pretrained', prefix='backbone.',
                                         checkpoint='work_dirs/mpp_vit_tiny_shapes/iter_600.pth')))

# Fine-tuning: the same schedule and base lr as from scratch (the pyramid and heads are new and learn at
# it), with layer-wise lr decay 0.8 over the backbone's 6 depths (patch embedding at 0.8^5 = 0.33x, the
# last block at 0.8x): the pre-trained early layers move less. A choice for this model size, between
# ViTDet's 0.7 (ViT-B) and 0.9 (ViT-H), not tuned: it is the one setting the results in
# projects/mpp_detection/README.md were measured with.
optim_wrapper = dict(paramwise_cfg=dict(layer_decay_rate=0.8))
