# R50+ViT-B/16, the paper's hybrid: a ResNet-50 stem (weight-standardised convs, GroupNorm, stages
# (3, 4, 9), total stride 16) whose feature map is embedded with patch size 1 and fed to ViT-B
# (98,659,112 params at 1000 classes). "/16" is the ResNet's total downsampling, not a patch size.
_base_ = ['./vit_b16.py']
model = dict(
    backbone=dict(_delete_=True, type='vit_plugin.HybridViT', arch='b', layers=(3, 4, 9), patch_size=1,
                  img_size=224, drop_rate=0.1,
                  # the official model's numerics (see vit_b16.py)
                  gelu_approximate='tanh', norm_eps=1e-6,
                  expected_input_norm=dict(mean=[127.5] * 3, std=[127.5] * 3)),
    head=dict(in_channels=768, hidden_dim=768),
)
