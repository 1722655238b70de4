"""Layer scan on XLA: the compiler sees one Transformer block instead of all of them.

XLA traces the whole training step into one graph and compiles it. Unrolled, a ViT-L/16 step holds
24 copies of the block (32 for H/14), forward and backward, and compile time grows with them.
``torch_xla.experimental.scan_layers`` stacks the blocks' weights and runs one traced block in a
compiled loop (an XLA ``While``), so the graph holds a single block whatever the depth.

The scan reuses the first block's code for every block, so all blocks must compute the same
function of their own weights. In a ViT that rules out, and :func:`check_scannable` refuses:

* **stochastic depth** (``drop_path_rate > 0``): each block has its own drop probability;
* **dropout** (``drop_rate`` / ``attn_drop_rate > 0``): torch_xla 2.9 fails to build random masks
  inside the scanned body (an XLA element-type error), so the paper's ImageNet-21k recipe
  (dropout 0.1) must run unrolled. Its JFT recipe and masked patch prediction use no dropout;
* **windowed blocks mixed with global ones**, and outputs taken from intermediate blocks
  (detection backbones): only the last block's output leaves the loop.

Under SPMD, torch_xla's scan shards its backward pass with JAX's ``shard_alike``, so that
combination needs the ``jax`` package (``pip install torch_xla[pallas]`` brings it); without it
:func:`require_scan_support` refuses before training starts.

Activation checkpointing (``with_cp``) is kept: the scan's backward recomputes each block from its
input (min-cut rematerialisation) instead of storing its activations.

The price is paid at run time: the weights are stacked into one tensor per kind every step (and the
gradients unstacked). Measured on XLA:CPU with ViT-L/16 (``tools/analysis/benchmark_xla_compile.py``),
the scan cut compile time to 0.72x and made the steady step 1.44x slower; it pays where compilation
dominates (very deep models, short jobs, many restarts), not for long runs.

``tools/train.py CONFIG --launcher xla --xla-layer-scan`` turns it on (also with ``--xla-spmd``):
:func:`enable_layer_scan` gives every ViT in the model :func:`scan_blocks` through the backbone's one
extension point, :meth:`vit_plugin.models.ViT.set_block_runner`.
"""
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
    """Raise ``ValueError`` when this installation cannot scan layers (under SPMD, torch_xla shards the
    scanned backward pass with ``jax.experimental.shard_alike``, so it needs ``jax``)."""
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
    """Make every ViT inside ``model`` run its blocks with :func:`scan_blocks` (``ViT.set_block_runner``).

    Returns:
        list[str]: The names of the modules switched (``ValueError`` when there is none, or when one
        cannot be scanned: see :func:`check_scannable`).
    """
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
