"""Masked patch prediction: the self-supervised pre-training of the ViT paper (Appendix B.1.2)."""
from typing import Dict, List, Optional, Union

import torch
import torch.nn as nn
from mmpretrain.models.selfsup import BaseSelfSupervisor

from vit_plugin.registry import MODELS
from ..backbones.vit import ViT
from ..layers import PatchEmbed
from .corruption import CorruptionPlan, apply_corruption, check_corruption_args, sample_corruption
from .targets import compute_targets, unnormalize


@MODELS.register_module()
class MaskedPatchPrediction(BaseSelfSupervisor):
    """Masked patch prediction: corrupt patch embeddings, predict a target of each corrupted patch (docs/mpp.md).

    Args:
        backbone (dict): A ``vit_plugin.ViT`` config (not ``HybridViT``); its ``out_type`` is not used.
        head (dict): An :class:`~vit_plugin.models.selfsup.MPPHead` config; its ``target`` selects
            the target.
        corrupt_ratio (float): Fraction of patches corrupted per image. Defaults to 0.5.
        mask_prob (float): Share of corrupted patches replaced by [mask]. Defaults to 0.8.
        random_prob (float): Share replaced by a random other patch. Defaults to 0.1.
        random_source (str): 'batch' or 'image'. Defaults to 'batch'.
        data_preprocessor (dict, optional): Defaults to mmpretrain's ``SelfSupDataPreprocessor``
            without normalisation; the targets undo any normalisation.
        init_cfg (dict, optional): Defaults to None.

    Raises:
        ValueError: Corruption settings out of range, or a hybrid backbone.
    """

    def __init__(self,
                 backbone: dict,
                 head: dict,
                 corrupt_ratio: float = 0.5,
                 mask_prob: float = 0.8,
                 random_prob: float = 0.1,
                 random_source: str = 'batch',
                 data_preprocessor: Optional[Union[dict, nn.Module]] = None,
                 init_cfg: Optional[dict] = None):
        super().__init__(backbone=backbone, head=head, data_preprocessor=data_preprocessor, init_cfg=init_cfg)
        name = type(self.backbone).__name__
        if not isinstance(self.backbone, ViT):
            raise TypeError(f'MaskedPatchPrediction needs a ViT backbone (type="vit_plugin.ViT"), got {name}')
        # The paper's corruption hides a patch by replacing its embedding; that only hides it when the
        # embedding is computed from that patch alone, as the linear patch projection is. A hybrid's tokens
        # each see a wide region of the image, so a corrupted patch would stay visible in its neighbours'.
        if not isinstance(self.backbone.patch_embed, PatchEmbed):
            raise TypeError(f'MaskedPatchPrediction needs a backbone whose tokens each embed one image patch '
                            f'(the linear patch projection of type="vit_plugin.ViT"); {name} embeds with '
                            f'{type(self.backbone.patch_embed).__name__}. Pre-train a plain vit_plugin.ViT.')
        if tuple(self.head.patch_size) != tuple(self.backbone.patch_size):
            raise ValueError(f'the head is configured for {self.head.patch_size} patches but the backbone uses '
                             f'{self.backbone.patch_size}; set head.patch_size to the backbone patch size')
        check_corruption_args(corrupt_ratio, mask_prob, random_prob, random_source)
        self.corrupt_ratio = corrupt_ratio
        self.mask_prob = mask_prob
        self.random_prob = random_prob
        self.random_source = random_source
        self.mask_token = nn.Parameter(torch.zeros(1, 1, self.backbone.embed_dims))

    def init_weights(self):
        super().init_weights()
        if self.init_cfg is None:
            nn.init.normal_(self.mask_token, std=0.02)  # as BERT initialises its embeddings

    def get_layer_depth(self, param_name: str):
        """Layer depth for layer-wise lr decay: the [mask] embedding sits with the patch embedding."""
        if param_name == 'mask_token':
            return 0, self.backbone.num_layers + 2
        return super().get_layer_depth(param_name)

    # ------------------------------------------------------------------ pieces
    def sample_corruption(self, batch_size: int, num_patches: int, device=None) -> CorruptionPlan:
        """Draw which patches to corrupt and how (override or patch this to control it in tests)."""
        return sample_corruption(batch_size, num_patches, self.corrupt_ratio, self.mask_prob, self.random_prob,
                                 self.random_source, device=device)

    def encode_corrupted(self, inputs: torch.Tensor, plan: Optional[CorruptionPlan] = None):
        """Corrupt and encode normalised images -> (patch tokens (B, N, D) after the final norm, the plan)."""
        used = []

        def corrupt(patches):
            nonlocal plan
            if plan is None:
                plan = self.sample_corruption(patches.shape[0], patches.shape[1], device=patches.device)
            used.append(plan)
            return apply_corruption(patches, plan, self.mask_token)

        x = self.backbone.encode(*self.backbone.embed(inputs, patch_transform=corrupt))
        return x[:, self.backbone.num_prefix_tokens:], used[0]

    def _targets(self, inputs: torch.Tensor, num_tokens: Optional[int] = None) -> torch.Tensor:
        """Targets (B, N, ...) of every patch; raises if N differs from ``num_tokens``."""
        pixels = unnormalize(inputs, self.data_preprocessor)
        target = compute_targets(self.head.target, pixels, self.backbone.patch_size, self.head.color_bits,
                                 self.head.cells)
        if num_tokens is not None and target.shape[1] != num_tokens:
            (H, W), (ph, pw) = inputs.shape[-2:], self.backbone.patch_size
            raise ValueError(f'{target.shape[1]} MPP targets (a {H}x{W} image in {ph}x{pw} patches) but the '
                             f'backbone made {num_tokens} patch tokens; each token must embed exactly one '
                             f'backbone.patch_size patch of the image')
        return target

    @staticmethod
    def _gather(x: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """Rows ``ids`` (B, K) of every image in ``x`` (B, N, ...) -> (B, K, ...)."""
        index = ids.reshape(*ids.shape, *([1] * (x.dim() - 2))).expand(-1, -1, *x.shape[2:])
        return x.gather(1, index)

    @staticmethod
    def _single_view(inputs: Union[torch.Tensor, List[torch.Tensor]]) -> torch.Tensor:
        # SelfSupDataPreprocessor returns a list when the pipeline makes several views; MPP uses one.
        if isinstance(inputs, (list, tuple)):
            if len(inputs) != 1:
                raise ValueError(f'masked patch prediction takes one view per image, the pipeline made '
                                 f'{len(inputs)}; remove the multi-view transform from the pipeline')
            inputs = inputs[0]
        return inputs

    # ------------------------------------------------------------------ training / analysis
    def loss(self, inputs, data_samples=None, **kwargs) -> Dict[str, torch.Tensor]:
        """Corrupt, encode, predict -> ``loss`` over the corrupted patches (and ``acc`` for class targets)."""
        inputs = self._single_view(inputs)
        latent, plan = self.encode_corrupted(inputs)
        target = self._targets(inputs, latent.shape[1])
        return self.head.loss(self._gather(latent, plan.ids), self._gather(target, plan.ids))

    @torch.no_grad()
    def predict_corrupted(self, inputs: torch.Tensor, plan: Optional[CorruptionPlan] = None) -> dict:
        """Predictions for the corrupted patches -> dict of ``plan``, ``pred``, ``target``, ``pixels`` (0-255)."""
        inputs = self._single_view(inputs)
        latent, plan = self.encode_corrupted(inputs, plan)
        return dict(plan=plan, pred=self.head(self._gather(latent, plan.ids)),
                    target=self._gather(self._targets(inputs, latent.shape[1]), plan.ids),
                    pixels=unnormalize(inputs, self.data_preprocessor))
