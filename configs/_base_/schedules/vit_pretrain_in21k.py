# The paper's pre-training schedule (Section 4.1 and Appendix B.1, Table 3, ImageNet-21k rows).
#
# Counted in optimizer steps at the global batch of 4096. tools/train.py reaches that batch on any
# number of devices by gradient accumulation and rescales every iteration count below accordingly
# (vit_plugin/engine/global_batch.py); `--cfg-options global_batch_size=None --auto-scale-lr` trains
# with the batch you have and scales the learning rate linearly instead.
global_batch_size = 4096
auto_scale_lr = dict(base_batch_size=4096, enable=False)

# 90 epochs of ImageNet-21k (14,197,122 images in the official 2020 release) at batch 4096.
# Table 3 also lists 30 epochs for L/16 (override train_cfg.max_iters=104000 and the decay `end`).
max_steps = 312000
warmup_steps = 10000  # paper: linear warm-up over 10k steps

optim_wrapper = dict(
    # Drops NaN/inf updates before they reach the weights (default_hooks.nonfinite_guard reports them).
    # `--amp`: its mixed-precision counterpart for the device (bf16 or fp16).
    type='vit_plugin.GuardedOptimWrapper',
    # Adam with b1=0.9, b2=0.999. The paper's weight decay (0.03 for ImageNet-21k, Table 3) is the
    # decoupled decay of the Flax optimiser it used, which is AdamW's: param -= lr * wd * param.
    # As in the official code it applies to every parameter; use paramwise_cfg to exclude some.
    optimizer=dict(type='AdamW', lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.03),
    clip_grad=dict(max_norm=1.0),  # global-norm clipping at 1 (Table 3 footnote)
)

param_scheduler = [
    # Linear warm-up from ~0 to the base learning rate (mmengine's LinearLR is multiplicative, so
    # it cannot start at exactly 0).
    dict(type='LinearLR', start_factor=1e-4, end_factor=1.0, by_epoch=False, begin=0, end=warmup_steps),
    # ... then linear decay to 0 at the last step.
    dict(type='LinearLR', start_factor=1.0, end_factor=0.0, by_epoch=False, begin=warmup_steps,
         end=max_steps),
]

train_cfg = dict(type='vit_plugin.IterBasedTrainLoop', max_iters=max_steps)
# ImageNet-21k has no official validation split; the dataset configs leave validation off.
val_cfg = None
test_cfg = None

log_processor = dict(by_epoch=False)
