# ViTDet-style Mask R-CNN (Li et al., ECCV 2022) with the paper's ViT-B/16: only the last block's
# stride-16 map is used, a simple feature pyramid (deconvolutions / identity / pooling, LayerNorm over
# channels) makes strides 4-64 from it, and most blocks attend within 14x14-patch windows (blocks 2,
# 5, 8, 11 stay global), which keeps memory and time near-linear in the image area; every block adds
# ViTDet's decomposed relative position bias (tables start at zero: the checkpoint has none). The rest
# is mmdet's own Mask R-CNN 1x COCO recipe.
_base_ = 'mmdet::mask_rcnn/mask-rcnn_r50_fpn_1x_coco.py'
custom_imports = dict(imports=['vit_plugin'], allow_failed_imports=False)
default_scope = 'mmdet'
# Skip NaN/inf updates before they reach the weights (see configs/_base_/default_runtime.py).
default_hooks = dict(nonfinite_guard=dict(type='vit_plugin.NonFiniteGuardHook', max_consecutive=10))

# ---- The backbone: the only lines to change for another ViT or checkpoint --------------------------
# embed_dims is the arch's width: 'ti' 192, 's' 384, 'b' 768, 'l' 1024, 'h' 1280. The checkpoint may be
# one of ours (mmpretrain classifier or MPP pre-training, keys 'backbone.*') or a converted official
# one; its 224-px position embedding is resized to img_size on load and to each batch's padded shape
# on the fly. window_block_indices=None: ViTDet's rule for any depth, the last block of each of 4
# stages (as equal as possible) stays global, the others are windowed: blocks 2, 5, 8, 11 of 'b',
# 5, 11, 17, 23 of 'l', 7, 15, 23, 31 of 'h'; with 4 or fewer blocks none is windowed (a warning says so).
embed_dims = 768
model = dict(
    backbone=dict(
        _delete_=True,
        type='vit_plugin.ViT',
        arch='b',
        patch_size=16,
        img_size=(800, 1344),  # the largest padded batch of the 1x pipeline (1333x800, divisor 32)
        out_type='featmap',
        out_indices=-1,
        drop_path_rate=0.1,
        window_size=14,
        window_block_indices=None,
        use_rel_pos=True,
        with_cp=False,  # True: activation checkpointing (see the README's benchmark table)
        init_cfg=dict(type='Pretrained', checkpoint='checkpoints/vit-b16_in21k.pth', prefix='backbone.')),
    # ----------------------------------------------------------------------------------------------------
    # The paper's ViTs see inputs scaled to [-1, 1].
    data_preprocessor=dict(mean=[127.5, 127.5, 127.5], std=[127.5, 127.5, 127.5]),
    neck=dict(_delete_=True, type='vit_plugin.SimpleFeaturePyramid', in_channels=embed_dims, out_channels=256,
              scale_factors=(4.0, 2.0, 1.0, 0.5), num_outs=5))

# AdamW with layer-wise lr decay 0.7 (ViTDet's value for ViT-B; 0.8 for ViT-L, 0.9 for ViT-H) and no
# weight decay on norms, biases, pos_embed and cls_token. For mixed precision on GPU use
# type='AmpOptimWrapper' (or mmdet's `tools/train.py --amp`).
optim_wrapper = dict(
    _delete_=True,
    type='OptimWrapper',
    constructor='vit_plugin.LayerDecayOptimWrapperConstructor',
    optimizer=dict(type='AdamW', lr=1e-4, betas=(0.9, 0.999), weight_decay=0.1),
    paramwise_cfg=dict(layer_decay_rate=0.7),
    clip_grad=dict(max_norm=1.0, norm_type=2))
