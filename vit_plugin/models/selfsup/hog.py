"""MaskFeat's HOG target for any patch grid."""
import torch
from mmpretrain.models.selfsup import HOGGenerator

from vit_plugin.registry import MODELS


@MODELS.register_module()
class PatchHOGGenerator(HOGGenerator):
    """mmpretrain's ``HOGGenerator`` with the patch size as an argument, any image size (docs/mpp.md).

    Args:
        patch_size (int): Pixels per patch side of the encoder. Defaults to 16.
        nbins (int): Orientation bins per cell. Defaults to 9.
        pool (int): Pixels per cell side; must divide ``patch_size``. Defaults to 8.
        gaussian_window (int): Side of the Gaussian weighting of gradient magnitudes, tiled over the
            image; 0 disables it. Defaults to 16.
    """

    def __init__(self, patch_size: int = 16, nbins: int = 9, pool: int = 8, gaussian_window: int = 16) -> None:
        if pool < 1 or patch_size % pool:
            raise ValueError(f'pool={pool} must divide patch_size={patch_size}: every patch needs whole HOG '
                             f'cells (e.g. pool={patch_size // 2} for 2 x 2 cells per patch, as MaskFeat has)')
        if gaussian_window and patch_size % gaussian_window and gaussian_window % patch_size:
            raise ValueError(f'gaussian_window={gaussian_window} is tiled over the image, so it must divide '
                             f'or be a multiple of patch_size={patch_size}; MaskFeat uses the patch size')
        super().__init__(nbins=nbins, pool=pool, gaussian_window=gaussian_window)
        self.patch_size = patch_size

    def _reshape(self, hog_feat: torch.Tensor) -> torch.Tensor:
        """(B, 3, nbins, H / pool, W / pool) cells -> (B, patches, 3 * nbins * cells per patch)."""
        hog_feat = hog_feat.flatten(1, 2)
        self.unfold_size = self.patch_size // self.pool
        hog_feat = hog_feat.permute(0, 2, 3, 1)
        hog_feat = hog_feat.unfold(1, self.unfold_size, self.unfold_size).unfold(2, self.unfold_size,
                                                                                  self.unfold_size)
        return hog_feat.flatten(1, 2).flatten(2)
