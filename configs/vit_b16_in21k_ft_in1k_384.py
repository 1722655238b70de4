# ViT-B/16: ImageNet-21k -> ImageNet-1k at 384 px.
# Fine-tuning of an ImageNet-21k pre-trained ViT-B/16 at 384 px with the paper's recipe (Appendix B.1.1):
# SGD momentum 0.9, batch 512, no weight decay, clip at global norm 1, 500 warm-up steps then cosine
# decay, 20000 steps (Table 4). The pre-training head (pre-logits + classifier) is dropped and a single
# zero-initialised linear layer is attached; the 14x14 position embedding is interpolated in 2D to
# the 24x24 grid of 384 px when the weights load, in the backbone's default mode 'official' (the
# official loader's bilinear), the rule for our own checkpoints and every config (see
# CHECKPOINT_RESIZE_MODE in vit_plugin/models/pos_embed.py for why).
_base_ = [
    '_base_/models/vit_b16.py',
    '_base_/datasets/imagenet1k_384.py',
    '_base_/schedules/vit_finetune.py',
    '_base_/default_runtime.py',
]

# Your pre-trained weights: a runner checkpoint of configs/vit_b16_in21k.py (its path is written to
# work_dirs/vit_b16_in21k/last_checkpoint), or an official .npz / its conversion by
# tools/convert_checkpoint.py. All three hold a whole classifier (backbone.*, head.*): keep
# prefix='backbone.', or drop it (prefix=None) and the bare backbone takes the 'backbone.' part itself.
# Official weights also record the GELU they were trained with (tanh), which the backbone then runs.
pretrained = 'checkpoints/vit_b16_in21k.pth'

model = dict(
    backbone=dict(
        img_size=384,
        drop_rate=0.0,  # the official fine-tuning runs use no dropout
        init_cfg=dict(type='Pretrained', checkpoint=pretrained, prefix='backbone.'),
    ),
    # hidden_dim=None: no pre-logits layer; the head's Linear is initialised to zeros.
    head=dict(num_classes={{_base_.num_classes}}, hidden_dim=None),
)

max_steps = 20000
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-4, end_factor=1.0, by_epoch=False, begin=0, end=500),
    dict(type='CosineAnnealingLR', eta_min=0.0, by_epoch=False, begin=500, end=max_steps),
]
train_cfg = dict(max_iters=max_steps, val_interval=max_steps)
default_hooks = dict(logger=dict(interval=50), checkpoint=dict(interval=max_steps, max_keep_ckpts=1))

# Polyak averaging with factor 0.9999, as for the paper's ImageNet results (Section 4.1); validation
# and the saved checkpoint's 'ema_state_dict' use the averaged weights. tools/train.py sets the
# hook's interval to the accumulation factor so the average moves once per optimizer step.
custom_hooks = [dict(type='EMAHook', momentum=1e-4, priority='ABOVE_NORMAL')]
