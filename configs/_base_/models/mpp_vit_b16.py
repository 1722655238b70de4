# Masked patch prediction (ViT paper, Appendix B.1.2) with a ViT-B/16 at 224 px: 50% of the patch
# embeddings corrupted (80% [mask] / 10% random other patch / 10% kept), the 3-bit mean colour of every
# corrupted patch predicted (512 classes). Switch the target with model.head.target
# ('mean_color_3bit', 'downsized_4x4_3bit', 'pixel_l2').
model = dict(
    type='vit_plugin.MaskedPatchPrediction',
    # The paper feeds pixels scaled to [-1, 1]; the targets undo this normalisation exactly.
    data_preprocessor=dict(type='SelfSupDataPreprocessor', mean=[127.5] * 3, std=[127.5] * 3, to_rgb=True),
    backbone=dict(type='vit_plugin.ViT', arch='b', img_size=224, patch_size=16, drop_rate=0.,
                  # the official model's numerics, as the fine-tuning configs declare them (see vit_b16.py)
                  gelu_approximate='tanh', norm_eps=1e-6,
                  expected_input_norm=dict(mean=[127.5] * 3, std=[127.5] * 3)),
    head=dict(type='vit_plugin.MPPHead', in_channels=768, target='mean_color_3bit', patch_size=16),
    corrupt_ratio=0.5,
    mask_prob=0.8,
    random_prob=0.1,
    random_source='batch')
