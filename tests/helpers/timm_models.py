"""The tiny timm ViT that the converter tests compare our ViT with, and the arch of ours that matches it."""
from timm.models.vision_transformer import VisionTransformer

#: our ViT's arch equal to :func:`timm_vit`'s (width 32, 2 blocks, 4 heads, MLP 64)
TINY = dict(embed_dims=32, num_layers=2, num_heads=4, mlp_dims=64)


def timm_vit(token=True, img_size=32, classes=5):
    return VisionTransformer(img_size=img_size, patch_size=8, embed_dim=32, depth=2, num_heads=4, mlp_ratio=2,
                             num_classes=classes, class_token=token, global_pool='token' if token else 'avg',
                             fc_norm=False).eval()
