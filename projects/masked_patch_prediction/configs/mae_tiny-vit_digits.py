# mmpretrain's MAE on the digits' training split (labels unused), beside MPP: the encoder is the tiny
# ViT of _tiny_vit.py (width 64, 4 blocks, 4 heads, MLP 128, patch 4 on 32 px: an 8x8 grid) as
# mmpretrain's MAEViT, with its fixed 2D sin-cos position embedding; the paper's 75 % of the patches
# are removed before the encoder, and the pixels of the removed ones are regressed with the
# per-patch normalised L2 loss (norm_pix). Decoder: 2 blocks of width 64, 4 heads, MLP 128 (half the
# encoder's depth; MAE's decoder is narrower and shallower than its encoder, and the paper finds a
# shallow decoder enough for fine-tuning). Data, augmentation, optimiser, schedule and batch are
# those of mpp_tiny-vit_digits.py, so the methods differ only in their objective.
#   python projects/masked_patch_prediction/compare_mim.py   (runs this, converts, fine-tunes, probes)
_base_ = ['./mpp_tiny-vit_digits.py']

model = dict(
    _delete_=True,
    type='MAE',
    data_preprocessor=dict(type='SelfSupDataPreprocessor', mean=[127.5] * 3, std=[127.5] * 3, to_rgb=True),
    backbone=dict(
        type='MAEViT',
        arch={{_base_.encoder_arch}},  # _tiny_vit.py's encoder
        img_size=32,
        patch_size=4,
        mask_ratio=0.75),
    neck=dict(
        type='MAEPretrainDecoder',
        num_patches=64,
        patch_size=4,
        in_chans=3,
        embed_dim=64,
        decoder_embed_dim=64,
        decoder_depth=2,
        decoder_num_heads=4,
        mlp_ratio=2.,
    ),
    head=dict(type='MAEPretrainHead', norm_pix=True, patch_size=4,
              loss=dict(type='PixelReconstructionLoss', criterion='L2')),
    # mmpretrain's MAE initialisation (the encoder then sets its sin-cos table and patch projection).
    init_cfg=[
        dict(type='Xavier', layer='Linear', distribution='uniform'),
        dict(type='Constant', layer='LayerNorm', val=1.0, bias=0.0)
    ])
