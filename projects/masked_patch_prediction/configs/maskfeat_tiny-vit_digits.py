# mmpretrain's MaskFeat on the digits' training split (labels unused), beside MPP: the encoder is the
# tiny ViT of _tiny_vit.py (width 64, 4 blocks, 4 heads, MLP 128, patch 4 on 32 px: an 8x8 grid) as
# mmpretrain's MaskFeatViT; masked patches become a learned [mask] token and a linear layer predicts
# the HOG features of every masked patch (L2 loss).
#
# Masking: mmpretrain's BEiTMaskGenerator (blocks of patches) at MaskFeat's ratio, 26 of 64 patches
# (40 %; the paper masks 78 of 196), blocks of at least 4 patches (the transform's default; the paper
# has 15 of 196, which is 5 on 64) with aspect ratios 0.3-3.3. The transform writes `mask` into the
# results and PackInputs packs it into every data sample, where MaskFeat reads it.
# HOG target: mmpretrain's HOGGenerator cuts its cells into a fixed 14x14 patch grid, so
# vit_plugin.PatchHOGGenerator groups the same histograms per 4-px patch instead. Cells of 2x2 px
# (pool 2), i.e. 2x2 cells per patch as MaskFeat's 8-px cells in 16-px patches, 9 orientation bins,
# the Gaussian weighting tiled per patch (window 4 = the patch, std 2, as MaskFeat's 16 / 8):
# 3 channels x 9 bins x 4 cells = 108 values per patch, MaskFeat's target size. The digits are 8x8
# scans upsampled bicubically to 32 px, so every 2x2 cell sees a non-zero gradient near the strokes.
# Data, augmentation, optimiser, schedule and batch are those of mpp_tiny-vit_digits.py.
#   python projects/masked_patch_prediction/compare_mim.py   (runs this, converts, fine-tunes, probes)
_base_ = ['./mpp_tiny-vit_digits.py']

model = dict(
    _delete_=True,
    type='MaskFeat',
    data_preprocessor=dict(type='SelfSupDataPreprocessor', mean=[127.5] * 3, std=[127.5] * 3, to_rgb=True),
    backbone=dict(
        type='MaskFeatViT',
        arch={{_base_.encoder_arch}},  # _tiny_vit.py's encoder
        img_size=32,
        patch_size=4),
    neck=dict(type='LinearNeck', in_channels=64, out_channels=108, norm_cfg=None,
              init_cfg=dict(type='TruncNormal', layer='Linear', std=0.02, bias=0)),
    head=dict(type='MIMHead', loss=dict(type='PixelReconstructionLoss', criterion='L2')),
    target_generator=dict(type='vit_plugin.PatchHOGGenerator', patch_size=4, nbins=9, pool=2,
                          gaussian_window=4),
)

train_dataloader = dict(dataset=dict(pipeline=[
    dict(type='vit_plugin.LoadImageFromFile'),
    dict(type='RandomResizedCrop', scale=32, crop_ratio_range=(0.6, 1.0)),
    dict(type='BEiTMaskGenerator', input_size=8, num_masking_patches=26, min_num_patches=4),
    dict(type='PackInputs'),
]))
