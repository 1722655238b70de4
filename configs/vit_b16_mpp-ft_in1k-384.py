# ViT-B/16: masked patch prediction (configs/vit_b16_mpp_in1k*.py) -> ImageNet-1k at 384 px.
# Identical to the supervised fine-tuning recipe of vit_b16_in21k_ft_in1k_384.py (the paper's Appendix
# B.1.1: SGD momentum 0.9, batch 512, no weight decay, clip 1, 500 warm-up steps, cosine decay, 20k
# steps), starting from an MPP runner checkpoint instead:
#   * only the backbone's weights load (prefix 'backbone.'): the [mask] embedding and the MPP head are
#     dropped; the classifier is a single zero-initialised linear layer;
#   * the 14x14 position-embedding grid of the 224-px pre-training is resized to 24x24 while loading,
#     in the same mode as in the supervised fine-tuning (the backbone's default, 'official'), so the
#     two fine-tunings differ only in the pre-trained weights.
#
#   bash tools/dist_train.sh configs/vit_b16_mpp-ft_in1k-384.py 8 \
#       --cfg-options model.backbone.init_cfg.checkpoint=work_dirs/vit_b16_mpp_in1k/iter_100000.pth
_base_ = ['./vit_b16_in21k_ft_in1k_384.py']

model = dict(
    backbone=dict(
        init_cfg=dict(type='Pretrained', prefix='backbone.',
                      checkpoint='work_dirs/vit_b16_mpp_in1k/iter_100000.pth'),
    ),
    head=dict(num_classes={{_base_.num_classes}}, hidden_dim=None),
)
