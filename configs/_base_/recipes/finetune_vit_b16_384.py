# Fine-tuning of an ImageNet-21k pre-trained ViT-B/16 at 384 px with the paper's recipe (Appendix
# B.1.1): SGD momentum 0.9, batch 512, no weight decay, clip at global norm 1, warm-up then cosine decay
# (_base_/schedules/vit_finetune.py). The pre-training head (pre-logits + classifier) is dropped and a
# single zero-initialised linear layer is attached; the 14x14 position embedding is interpolated in 2D
# to the 24x24 grid of 384 px when the weights load, in the backbone's default mode 'official' (the
# official loader's bilinear), the rule for our own checkpoints and every config (see
# CHECKPOINT_RESIZE_MODE in vit_plugin/models/pos_embed.py for why).
#
# A dataset's config adds its dataset, its number of classes and its length in steps (Table 4):
#     _base_ = ['../_base_/recipes/finetune_vit_b16_384.py', '../_base_/datasets/cifar10_384.py']
#     model = dict(head=dict(num_classes={{_base_.num_classes}}))  # the dataset config sets it
#     max_steps = 10000, with the schedulers, train_cfg and the checkpoint interval that count to it
_base_ = [
    '../models/vit_b16.py',
    '../schedules/vit_finetune.py',
    '../default_runtime.py',
]

# Your pre-trained weights: a runner checkpoint of configs/vit_b16_in21k.py (its path is written to
# work_dirs/vit_b16_in21k/last_checkpoint), or an official .npz / its conversion by
# tools/convert_checkpoint.py. All three hold a whole classifier (backbone.*, head.*): keep
# prefix='backbone.', or drop it (prefix=None) and the bare backbone takes the 'backbone.' part itself.
# The backbone declares the official numerics (tanh GELU, LayerNorm eps 1e-6, inputs in [-1, 1]; from
# ../models/vit_b16.py), so loading official weights, or ours trained by configs/vit_b16_in21k.py, changes
# nothing; checkpoint_numerics='error' refuses weights recorded with other numerics.
pretrained = 'checkpoints/vit_b16_in21k.pth'

model = dict(
    backbone=dict(
        img_size=384,
        drop_rate=0.0,  # the official fine-tuning runs use no dropout
        init_cfg=dict(type='Pretrained', checkpoint=pretrained, prefix='backbone.'),
    ),
    # hidden_dim=None: no pre-logits layer; the head's Linear is initialised to zeros.
    head=dict(hidden_dim=None),
)

default_hooks = dict(logger=dict(interval=50), checkpoint=dict(max_keep_ckpts=1))
