# Demo / test config: a tiny ViTDet-style Mask R-CNN trained from scratch on the generated shapes
# dataset (vit_plugin.ShapesCocoDataset writes it under data_root on first use; no download), with
# COCO bbox and segm mAP. Runs on a CPU in minutes:
#   python tools/train.py configs/mask_rcnn_vit_tiny_simplefpn_shapes.py   (mmdet's train script)
_base_ = ['./mask_rcnn_vit_b16_simplefpn_1x_coco.py', './_base_/models/vit_tiny_shapes.py']

# ---- The backbone: a 4-block, 96-wide ViT on 8x8 patches, two of its blocks windowed, rel-pos bias -
# (configs/_base_/models/vit_tiny_shapes.py, shared with its MPP pre-training)
embed_dims = _base_.backbone.arch.embed_dims
width = 64  # narrower heads than COCO's 256 keep the CPU run short
num_classes = 3
model = dict(
    backbone=dict(_delete_=True, **_base_.backbone, out_type='featmap', out_indices=-1, init_cfg=None),
    # ----------------------------------------------------------------------------------------------------
    # a stride-8 ViT map: 2x, 1x, 0.5x give strides 4, 8, 16; pooling adds 32 and 64 (num_outs=5)
    neck=dict(in_channels=embed_dims, out_channels=width, scale_factors=(2.0, 1.0, 0.5)),
    rpn_head=dict(in_channels=width, feat_channels=width),
    roi_head=dict(
        # a fixed 2x2 samples per bin: mmcv's CPU RoIAlign backward dominates the step otherwise
        bbox_roi_extractor=dict(out_channels=width, roi_layer=dict(sampling_ratio=2)),
        bbox_head=dict(in_channels=width, fc_out_channels=256, num_classes=num_classes),
        mask_roi_extractor=dict(out_channels=width, roi_layer=dict(sampling_ratio=2)),
        mask_head=dict(num_convs=2, in_channels=width, conv_out_channels=width, num_classes=num_classes)),
    # at most 4 objects an image: far fewer proposals and sampled RoIs than COCO's
    train_cfg=dict(rpn_proposal=dict(nms_pre=300, max_per_img=100), rcnn=dict(sampler=dict(num=64))),
    test_cfg=dict(rpn=dict(nms_pre=300, max_per_img=100), rcnn=dict(max_per_img=20)))

data_root = 'data/shapes_coco/'
train_pipeline = [
    # Checked decoding in training; the test pipeline keeps mmcv's LoadImageFromFile, which mmdet's
    # DetInferencer looks for (tools/infer.py decodes with the checked decoder all the same).
    dict(type='vit_plugin.LoadImageFromFile'),
    dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
    dict(type='Resize', scale=(160, 160), keep_ratio=True),
    dict(type='RandomFlip', prob=0.5),
    dict(type='PackDetInputs'),
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='Resize', scale=(160, 160), keep_ratio=True),
    dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
    dict(type='PackDetInputs', meta_keys=('img_id', 'img_path', 'ori_shape', 'img_shape', 'scale_factor')),
]
dataset = dict(type='vit_plugin.ShapesCocoDataset', data_root=data_root, num_images=dict(train=128, val=32))
train_dataloader = dict(
    batch_size=8, num_workers=0, persistent_workers=False,
    dataset=dict(_delete_=True, **dataset, ann_file='annotations/instances_train.json',
                 data_prefix=dict(img='train/'), filter_cfg=dict(filter_empty_gt=True), pipeline=train_pipeline))
val_dataloader = dict(
    batch_size=8, num_workers=0, persistent_workers=False,
    dataset=dict(_delete_=True, **dataset, ann_file='annotations/instances_val.json',
                 data_prefix=dict(img='val/'), test_mode=True, pipeline=test_pipeline))
test_dataloader = val_dataloader
val_evaluator = dict(ann_file=data_root + 'annotations/instances_val.json', metric=['bbox', 'segm'])
test_evaluator = val_evaluator

max_epochs = 24
train_cfg = dict(max_epochs=max_epochs, val_interval=max_epochs)
param_scheduler = [
    dict(type='LinearLR', start_factor=0.01, by_epoch=False, begin=0, end=20),
    dict(type='CosineAnnealingLR', by_epoch=True, begin=0, end=max_epochs, eta_min_ratio=0.05,
         convert_to_iter_based=True),
]
# From scratch: no layer decay (rate 1.0), a higher learning rate than fine-tuning.
optim_wrapper = dict(optimizer=dict(lr=1e-3, weight_decay=0.05), paramwise_cfg=dict(layer_decay_rate=1.0))
default_hooks = dict(logger=dict(interval=10), checkpoint=dict(interval=max_epochs, max_keep_ckpts=1))
auto_scale_lr = dict(enable=False)
