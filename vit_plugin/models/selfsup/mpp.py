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
    """Corrupt half of the patch embeddings, predict a target of every corrupted patch from its output.

    Per image, ``round(corrupt_ratio * N)`` patch embeddings are corrupted *before* the position
    embedding is added (so each keeps its slot's position): of those, ``mask_prob`` become a learnable
    [mask] embedding, ``random_prob`` the embedding of a random other patch, the rest stay as they are
    (see :mod:`~vit_plugin.models.selfsup.corruption`). The encoder's output token of every corrupted
    patch goes through the head, which predicts a target computed from the *un-normalised* pixels
    (see :mod:`~vit_plugin.models.selfsup.targets`). The class token takes part in attention but is
    not trained on directly.

    All shapes are fixed by the input size: corrupted positions are gathered and written back with
    index operations, so the step compiles once on XLA.

    Args:
        backbone (dict): A :class:`~vit_plugin.models.backbones.ViT` config (``type='vit_plugin.ViT'``);
            its ``out_type`` does not matter here (the algorithm reads all patch tokens after the
            final norm), which keeps the backbone config identical to the fine-tuning one. Windowed
            blocks and relative position bias work as in the backbone's own forward. The hybrid
            (``HybridViT``) is refused: each of its tokens is computed from a wide region of the image
            by the ResNet, so corrupting a token would leave its pixels visible in its neighbours.
        head (dict): An :class:`~vit_plugin.models.selfsup.MPPHead` config; its ``target`` selects the
            prediction target.
        corrupt_ratio (float): Fraction of patches corrupted per image. Defaults to 0.5 (the paper;
            it also tried BERT's 0.15).
        mask_prob (float): Share of corrupted patches replaced by the [mask] embedding. Defaults to 0.8.
        random_prob (float): Share replaced by a random other patch's embedding. Defaults to 0.1.
        random_source (str): 'batch' (any other patch in the batch) or 'image' (another patch of the
            same image). Defaults to 'batch'.
        data_preprocessor (dict, optional): Defaults to None, mmpretrain's ``SelfSupDataPreprocessor``
            without normalisation; configs set ``mean=std=127.5`` for the paper's [-1, 1] inputs. The
            targets undo whatever normalisation it applies.
        init_cfg (dict, optional): Defaults to None.
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
        """Corrupt the patch embeddings of normalised images and encode them.

        Args:
            inputs (Tensor): Normalised images (B, C, H, W).
            plan (CorruptionPlan, optional): Defaults to None (a fresh random plan).

        Returns:
            tuple[Tensor, CorruptionPlan]: Patch tokens after the final norm (B, N, D) (class token
            removed) and the plan that was applied.
        """
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
        """Targets (B, N, ...) of every patch of normalised images; checked against ``num_tokens``.

        The gather of corrupted positions indexes targets and tokens alike, so a count that differs
        would pair tokens with the targets of other patches without any error: refuse it here.
        """
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
        """Corrupt, encode, predict; the loss covers the corrupted patches only.

        Returns:
            dict[str, Tensor]: ``loss`` (optimised) and, for classification targets, ``acc`` (logged).
        """
        inputs = self._single_view(inputs)
        latent, plan = self.encode_corrupted(inputs)
        target = self._targets(inputs, latent.shape[1])
        return self.head.loss(self._gather(latent, plan.ids), self._gather(target, plan.ids))

    @torch.no_grad()
    def predict_corrupted(self, inputs: torch.Tensor, plan: Optional[CorruptionPlan] = None) -> dict:
        """What the model predicts for the corrupted patches (for visualisation and analysis).

        Args:
            inputs (Tensor): Normalised images (B, C, H, W).
            plan (CorruptionPlan, optional): Defaults to None (a fresh random plan).

        Returns:
            dict: ``plan``; ``pred`` (B, K, ...) the head's outputs (logits, or pixels in [-1, 1]);
            ``target`` (B, K, ...) the true targets; ``pixels`` (B, C, H, W) the un-normalised input.
        """
        inputs = self._single_view(inputs)
        latent, plan = self.encode_corrupted(inputs, plan)
        return dict(plan=plan, pred=self.head(self._gather(latent, plan.ids)),
                    target=self._gather(self._targets(inputs, latent.shape[1]), plan.ids),
                    pixels=unnormalize(inputs, self.data_preprocessor))
