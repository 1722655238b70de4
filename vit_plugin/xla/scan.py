"""Layer scan on XLA: the compiler sees one Transformer block instead of all (docs/scaling.md#layer-scan)."""
import importlib.util
import logging
from typing import List, Tuple

import torch
import torch.nn as nn
from mmcv.cnn.bricks import DropPath
from mmengine.logging import print_log

from vit_plugin.models.backbones.vit import ViT
from . import runtime


class _BlockOnGrid(nn.Module):
    """One encoder block with the patch grid bound, as the single-input layer ``scan_layers`` takes."""

    def __init__(self, block: nn.Module, grid: Tuple[int, int]):
        super().__init__()
        self.block = block
        self.grid = grid

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # The block's own checkpointing would nest inside the traced body; the scan's partition
        # function does the recomputation instead (see scan_blocks).
        return self.block._forward(x, self.grid)


def _settings(module: nn.Module) -> List[tuple]:
    """The non-weight state of every sub-module (types and Python scalars such as dropout rates)."""
    out = []
    for name, sub in module.named_modules():
        scalars = {k: v for k, v in vars(sub).items()
                   if not k.startswith('_') and k != 'training' and isinstance(v, (int, float, bool, str, tuple))}
        out.append((name, type(sub).__name__, tuple(sorted(scalars.items()))))
    return out


def _random_layers(module: nn.Module) -> List[str]:
    found = []
    for name, sub in module.named_modules():
        p = sub.p if isinstance(sub, nn.Dropout) else sub.drop_prob if isinstance(sub, DropPath) else 0
        if p > 0:
            found.append(f'{name} ({type(sub).__name__} p={p})')
    return found


def require_scan_support(spmd: bool) -> None:
    """Raise ``ValueError`` when this installation cannot scan (under SPMD torch_xla needs ``jax``)."""
    if spmd and importlib.util.find_spec('jax') is None:
        raise ValueError('layer scan under SPMD needs the jax package: pip install "torch_xla[pallas]" (or jax), '
                         'or drop --xla-layer-scan or --xla-spmd.')


def check_scannable(backbone: nn.Module, name: str = 'backbone') -> None:
    """Raise ``ValueError`` saying what to change when ``backbone``'s blocks cannot run as one scan."""
    if not isinstance(backbone, ViT):
        raise ValueError(f'layer scan: {name} ({type(backbone).__name__}) is not a vit_plugin ViT.')
    blocks = backbone.blocks
    if len(blocks) < 2:
        return
    # torch_xla cannot draw random masks inside a scanned layer, and stochastic depth differs per block.
    random = _random_layers(blocks)
    if random:
        raise ValueError(f'layer scan: {name} has dropout or stochastic depth in its blocks '
                         f'({", ".join(random[:3])}{", ..." if len(random) > 3 else ""}), which a scanned layer '
                         'cannot run. Set model.backbone.drop_rate=0, attn_drop_rate=0 and drop_path_rate=0 '
                         '(--cfg-options), or train without --xla-layer-scan.')
    first = _settings(blocks[0])
    for i, block in enumerate(blocks[1:], start=1):
        if _settings(block) != first:
            raise ValueError(f'layer scan: block {i} of {name} is configured differently from block 0 '
                             '(e.g. windowed and global attention mixed); a scan runs one block definition '
                             'for all. Train without --xla-layer-scan.')
    if list(backbone.out_indices) != [len(blocks) - 1]:
        raise ValueError(f'layer scan: {name} returns the outputs of blocks {list(backbone.out_indices)}, but '
                         f'only the last block ({len(blocks) - 1}) leaves a scan. Use out_indices=-1 or train '
                         'without --xla-layer-scan.')


def scan_blocks(blocks: nn.ModuleList, x: torch.Tensor, grid: Tuple[int, int]) -> torch.Tensor:
    """Run ``blocks`` on tokens ``x`` as one XLA loop (a block runner, see ``ViT.set_block_runner``)."""
    scan_layers = runtime.require('torch_xla.experimental.scan_layers').scan_layers
    kwargs = {}
    if any(b.with_cp for b in blocks) and torch.is_grad_enabled():
        from functorch.compile import min_cut_rematerialization_partition
        kwargs['partition_fn'] = min_cut_rematerialization_partition
    return scan_layers([_BlockOnGrid(b, grid) for b in blocks], x, **kwargs)


def enable_layer_scan(model: nn.Module) -> List[str]:
    """Scan the blocks of every ViT in ``model``; returns their names. ValueError: none, or not scannable."""
    names = []
    for name, module in model.named_modules():
        if isinstance(module, ViT):
            check_scannable(module, name or type(module).__name__)
            module.set_block_runner(scan_blocks)
            names.append(name)
    if not names:
        raise ValueError(f'layer scan: {type(model).__name__} has no vit_plugin ViT backbone to scan.')
    print_log(f'XLA layer scan: {", ".join(names)} run their blocks as one compiled loop.', logger='current',
              level=logging.INFO)
    return names
