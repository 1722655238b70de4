# The paper's ViT-B/16 in an mmdet detector: the backbone, the input scaling, the pyramid for mmdet's
# FPN and the AdamW optimiser with layer-wise lr decay, shared by the COCO detection configs. A
# detection config lists mmdet's recipe and this file as its bases and picks the parts it needs:
#     _base_ = ['mmdet::mask_rcnn/mask-rcnn_r50_fpn_1x_coco.py', './_base_/recipes/det_vit_b16.py']
#     model = dict(backbone=_base_._vit_backbone, data_preprocessor=_base_._vit_data_preprocessor,
#                  neck=_base_._vit_fpn_neck)
#     optim_wrapper = _base_._vit_optim_wrapper
#     default_hooks = _base_._guard_hooks
# (mmdet's recipe defines `model` and `optim_wrapper` itself, and two bases may not define the same
# name: the shared parts are the variables below, whose names start with `_`; nothing reads them.)
custom_imports = dict(imports=['vit_plugin'], allow_failed_imports=False)
# The one line that gives a config on mmdet's runtime what vit_plugin's runtime gives (also under mmdet's
# own tools/train.py): global_batch_size, the device defaults, pre-emption and atomic checkpoints, the
# input-scaling check (switches: docs/configs.md#one-runner-named-by-the-config).
runner_type = 'vit_plugin.Runner'
# Skip NaN/inf updates before they reach the weights (see configs/_base_/default_runtime.py).
# RunnerCheckHook reports a run mmengine's Runner.from_cfg built without the run plan (it ignores runner_type).
_guard_hooks = dict(nonfinite_guard=dict(type='vit_plugin.NonFiniteGuardHook', max_consecutive=10),
                    runner_check=dict(type='vit_plugin.RunnerCheckHook'))

# ---- The backbone: the only lines to change for another ViT or checkpoint --------------------------
# embed_dims is the arch's width: 'ti' 192, 's' 384, 'b' 768, 'l' 1024, 'h' 1280. The checkpoint may be
# one of ours (mmpretrain classifier or MPP pre-training, keys 'backbone.*') or a converted official
# one; its 224-px position embedding is resized to img_size on load and to each batch's padded shape
# on the fly. Use out_indices=(5, 11, 17, 23) for a 24-block arch ('l').
embed_dims = 768
_vit_backbone = dict(
    _delete_=True,
    type='vit_plugin.ViT',
    arch='b',
    patch_size=16,
    img_size=(800, 1344),  # the largest padded batch of the 1x pipeline (1333x800, divisor 32)
    out_type='featmap',
    out_indices=(2, 5, 8, 11),
    drop_path_rate=0.1,
    with_cp=False,  # True: activation checkpointing (see the README's benchmark table)
    # The official model's numerics (Flax's tanh GELU, LayerNorm eps 1e-6, pixels to [-1, 1]), declared so
    # that official checkpoints load without changing the model (docs/checkpoints.md#numerics-records).
    gelu_approximate='tanh',
    norm_eps=1e-6,
    expected_input_norm=dict(mean=[127.5] * 3, std=[127.5] * 3),
    init_cfg=dict(type='Pretrained', checkpoint='checkpoints/vit-b16_in21k.pth', prefix='backbone.'))
# ----------------------------------------------------------------------------------------------------
# The paper's ViTs see inputs scaled to [-1, 1].
_vit_data_preprocessor = dict(mean=[127.5, 127.5, 127.5], std=[127.5, 127.5, 127.5])

# The ViT's single stride-16 width turned into a stride 4-32 pyramid: the four blocks of out_indices
# rescaled (deconvolutions / identity / max-pooling), then mmdet's standard FPN.
_vit_fpn_neck = [
    dict(type='vit_plugin.SimpleFeaturePyramid', in_channels=embed_dims, out_channels=None,
         scale_factors=(4.0, 2.0, 1.0, 0.5)),
    dict(type='FPN', in_channels=[embed_dims // 4, embed_dims // 2, embed_dims, embed_dims], out_channels=256,
         num_outs=5),
]

# AdamW with layer-wise lr decay 0.7 (the blocks near the input change least; ViTDet's value for
# ViT-B, 0.8 for ViT-L, 0.9 for ViT-H) and no weight decay on norms, biases, pos_embed and cls_token.
# For mixed precision use `tools/train.py --amp` (vit_plugin's wrapper for the device: bf16, or fp16 with
# a dynamic loss scale); it works with this constructor.
_vit_optim_wrapper = dict(
    _delete_=True,
    type='vit_plugin.GuardedOptimWrapper',  # drops NaN/inf updates (docs/configs.md)
    constructor='vit_plugin.LayerDecayOptimWrapperConstructor',
    optimizer=dict(type='AdamW', lr=1e-4, betas=(0.9, 0.999), weight_decay=0.1),
    paramwise_cfg=dict(layer_decay_rate=0.7),
    clip_grad=dict(max_norm=1.0, norm_type=2))
