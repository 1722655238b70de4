"""BERT-style corruption of patch embeddings for masked patch prediction, static shapes (docs/mpp.md)."""
from dataclasses import dataclass

import torch

ACTION_MASK, ACTION_RANDOM, ACTION_KEEP = 0, 1, 2
RANDOM_SOURCES = ('batch', 'image')


@dataclass
class CorruptionPlan:
    """Corrupted positions ``ids`` (B, K), their ``actions``, flat ``sources`` (``b * N + n``), ``num_patches``."""
    ids: torch.Tensor
    actions: torch.Tensor
    sources: torch.Tensor
    num_patches: int

    def position_mask(self) -> torch.Tensor:
        """(B, N) float: 1 at corrupted positions, 0 elsewhere."""
        B = self.ids.shape[0]
        mask = torch.zeros(B, self.num_patches, device=self.ids.device)
        return mask.scatter(1, self.ids, 1.)


def num_corrupted(num_patches: int, corrupt_ratio: float) -> int:
    """The fixed number of corrupted patches per image: ``round(ratio * N)``, at least one."""
    return min(num_patches, max(1, int(round(corrupt_ratio * num_patches))))


def check_corruption_args(corrupt_ratio: float, mask_prob: float, random_prob: float, random_source: str):
    """Raise ``ValueError`` for settings :func:`sample_corruption` cannot draw from."""
    if random_source not in RANDOM_SOURCES:
        raise ValueError(f'random_source must be one of {RANDOM_SOURCES}, got {random_source!r}')
    if not (0. < corrupt_ratio <= 1.):
        raise ValueError(f'corrupt_ratio must be in (0, 1], got {corrupt_ratio}')
    if mask_prob < 0 or random_prob < 0 or mask_prob + random_prob > 1:
        raise ValueError(f'mask_prob ({mask_prob}) and random_prob ({random_prob}) must be >= 0 and sum to '
                         f'at most 1 (the rest of the corrupted patches is kept unchanged)')


def sample_corruption(batch_size: int, num_patches: int, corrupt_ratio: float = 0.5, mask_prob: float = 0.8,
                      random_prob: float = 0.1, random_source: str = 'batch',
                      device=None, generator=None) -> CorruptionPlan:
    """Draw a :class:`CorruptionPlan`; arguments as :class:`~.mpp.MaskedPatchPrediction`'s, ``generator`` optional."""
    check_corruption_args(corrupt_ratio, mask_prob, random_prob, random_source)
    pool = batch_size * num_patches if random_source == 'batch' else num_patches
    if pool < 2 and random_prob > 0:
        raise ValueError(f'cannot replace a patch by a random *other* patch: the {random_source} has a single '
                         f'patch; set random_prob=0 or use more patches')
    K = num_corrupted(num_patches, corrupt_ratio)
    kwargs = dict(device=device, generator=generator)
    ids = torch.rand(batch_size, num_patches, **kwargs).argsort(dim=1)[:, :K]
    draw = torch.rand(batch_size, K, **kwargs)
    actions = (draw >= mask_prob).long() + (draw >= mask_prob + random_prob).long()

    # A uniform draw over the other pool-1 patches: draw from 0..pool-2 and skip over the patch itself.
    own = ids if random_source == 'image' else ids + num_patches * torch.arange(batch_size, device=device)[:, None]
    sources = torch.randint(0, max(pool - 1, 1), (batch_size, K), **kwargs)
    sources = sources + (sources >= own).long()
    if random_source == 'image':
        sources = sources + num_patches * torch.arange(batch_size, device=device)[:, None]
    return CorruptionPlan(ids, actions, sources, num_patches)


def apply_corruption(patches: torch.Tensor, plan: CorruptionPlan, mask_token: torch.Tensor) -> torch.Tensor:
    """Patch embeddings (B, N, D) corrupted by ``plan`` (random ones take their source's clean embedding)."""
    B, N, D = patches.shape
    if N != plan.num_patches:
        raise ValueError(f'the corruption plan is for {plan.num_patches} patches per image, the backbone made {N}')
    index = plan.ids.unsqueeze(-1).expand(-1, -1, D)
    original = patches.gather(1, index)
    replacement = patches.reshape(B * N, D).index_select(0, plan.sources.reshape(-1)).reshape(original.shape)
    actions = plan.actions.unsqueeze(-1)
    new = torch.where(actions == ACTION_MASK, mask_token.to(patches.dtype).expand_as(original),
                      torch.where(actions == ACTION_RANDOM, replacement, original))
    return patches.scatter(1, index, new)
