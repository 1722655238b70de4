from .hybrid_vit import HybridViT
from .vit import ViT

__all__ = ['HybridViT', 'ViT']
