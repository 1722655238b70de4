"""FSDP wrapping for ViT models: which modules ``vit_plugin.FSDP2Strategy`` (``tools/train.py --fsdp``)
shards as their own unit."""
from typing import Optional, Sequence

import torch.nn as nn

from vit_plugin.models.layers import EncoderBlock
from vit_plugin.registry import FUNCTIONS


@FUNCTIONS.register_module()
def vit_block_wrap_policy(module: nn.Module, recurse: bool, nonwrapped_numel: int,
                          block_types: Optional[Sequence[type]] = None) -> bool:
    """FSDP auto-wrap policy: one FSDP unit per Transformer block, the rest in the root unit.

    Sharding block by block means only one block's full parameters are gathered at a time during the
    forward and backward passes, which is what lets ViT-H/14 train on GPUs that cannot hold it
    replicated (632M parameters and two Adam moments: ~10 GB in fp32 before activations).

    Args:
        module (nn.Module): Candidate module (FSDP's policy protocol).
        recurse (bool): Whether FSDP asks if it should descend into ``module``.
        nonwrapped_numel (int): Parameters not yet wrapped (unused; the policy is structural).
        block_types (Sequence[type], optional): Module classes that become FSDP units. Defaults to
            None: vit_plugin's ``EncoderBlock``.
    """
    if recurse:
        return True
    return isinstance(module, tuple(block_types) if block_types else (EncoderBlock, ))
