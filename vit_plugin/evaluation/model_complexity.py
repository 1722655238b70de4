"""Parameter and FLOP counts of ViT models next to Table 1; 1 multiply-add = 1 FLOP (docs/evaluation.md#figures)."""
from typing import Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn as nn

from vit_plugin.models.backbones.vit import ViT
from vit_plugin.models.pos_embed import to_2tuple

#: The parameter counts printed in the paper's Table 1. Its layer/width/MLP/head columns are
#: :attr:`ViT.arch_zoo` (the one table of the architectures).
PAPER_TABLE1 = {'base': '86M', 'large': '307M', 'huge': '632M'}

#: (arch, patch size) pairs the paper trains, for the default summary.
PAPER_MODELS = (('base', 32), ('base', 16), ('large', 32), ('large', 16), ('huge', 14))


def _dims(arch) -> dict:
    return dict(ViT.arch_zoo[arch.lower()]) if isinstance(arch, str) else dict(arch)


def vit_param_count(arch='base', patch_size=16, img_size=224, in_channels: int = 3, num_classes: int = 1000,
                    with_cls_token: bool = True, pre_logits: bool = False) -> int:
    """Exact parameter count of a plain ViT classifier (86,567,656 for ViT-B/16, 1000 classes)."""
    d = _dims(arch)
    D, M, L = d['embed_dims'], d['mlp_dims'], d['num_layers']
    ph, pw = to_2tuple(patch_size)
    h, w = to_2tuple(img_size)
    num_patches = (h // ph) * (w // pw)
    tokens = num_patches + int(with_cls_token)
    embed = in_channels * ph * pw * D + D + tokens * D + int(with_cls_token) * D
    block = 4 * D + (3 * D * D + 3 * D) + (D * D + D) + (D * M + M) + (M * D + D)
    head = (D * D + D if pre_logits else 0) + (D * num_classes + num_classes if num_classes else 0)
    return embed + L * block + 2 * D + head


def vit_flops(arch='base', patch_size=16, img_size=224, in_channels: int = 3, num_classes: int = 1000,
              with_cls_token: bool = True) -> int:
    """Multiply-adds of one plain ViT classifier forward on one image: patches ``N * C*ph*pw * D``, per block
    ``3 T D^2 + 2 T^2 D + T D^2 + 2 T D M``, head ``D K``."""
    d = _dims(arch)
    D, M, L = d['embed_dims'], d['mlp_dims'], d['num_layers']
    ph, pw = to_2tuple(patch_size)
    h, w = to_2tuple(img_size)
    num_patches = (h // ph) * (w // pw)
    T = num_patches + int(with_cls_token)
    block = 4 * T * D * D + 2 * T * T * D + 2 * T * D * M
    return num_patches * in_channels * ph * pw * D + L * block + D * num_classes


def measure_model(model: nn.Module, input_shape: Tuple[int, int, int, int]) -> Tuple[int, int]:
    """(parameters, multiply-adds) of ``model`` on a zero input of ``input_shape``, measured by torch."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    params = sum(p.numel() for p in model.parameters())
    device = next(model.parameters()).device
    counter = FlopCounterMode(display=False)
    # The fused CPU attention kernel has no FLOP formula in torch's counter (it would count 0);
    # the math backend decomposes into matmuls, which are counted.
    with torch.no_grad(), sdpa_kernel(SDPBackend.MATH), counter:
        model(torch.zeros(input_shape, device=device))
    return params, counter.get_total_flops() // 2  # torch counts a multiply-add as 2 FLOPs


def summary_rows(models: Sequence[Tuple[str, int]] = PAPER_MODELS, resolutions: Sequence[int] = (224, 384),
                 num_classes: int = 1000) -> List[Dict]:
    """One row per (arch, patch, resolution): sizes, sequence length, parameters, GFLOPs, Table 1 values."""
    rows = []
    for arch, patch in models:
        d = _dims(arch)
        for res in resolutions:
            rows.append(dict(model=f'ViT-{arch[0].upper()}/{patch}', resolution=res, layers=d['num_layers'],
                             hidden=d['embed_dims'], mlp=d['mlp_dims'], heads=d['num_heads'],
                             tokens=(res // patch)**2 + 1,
                             params=vit_param_count(arch, patch, res, num_classes=num_classes),
                             gflops=vit_flops(arch, patch, res, num_classes=num_classes) / 1e9,
                             paper_params=PAPER_TABLE1.get(arch, '-')))
    return rows


def format_gflops(gflops: float) -> str:
    """One decimal for paper-sized models, three significant digits for small ones (e.g. the demo)."""
    return f'{gflops:.1f}' if gflops >= 1 else f'{gflops:.3g}'


def format_markdown(rows: List[Dict]) -> str:
    """The rows as a Markdown table (params in millions)."""
    header = '| model | res | layers | hidden | MLP | heads | tokens | params | GFLOPs | paper params |'
    lines = [header, '|---' * (header.count('|') - 1) + '|']
    for r in rows:
        lines.append(f"| {r['model']} | {r['resolution']} | {r['layers']} | {r['hidden']} | {r['mlp']} | {r['heads']} "
                     f"| {r['tokens']} | {r['params'] / 1e6:.1f}M | {format_gflops(r['gflops'])} | {r['paper_params']} |")
    return '\n'.join(lines)


def config_row(name: str, vit: ViT, model: Optional[nn.Module] = None) -> Dict:
    """A summary row for a built model (measured), e.g. the one of a user config."""
    model = model if model is not None else vit
    h, w = vit.img_size
    params, macs = measure_model(model if model is vit else _BackboneThenHead(model), (1, 3, h, w))
    d = vit.arch_settings
    return dict(model=name, resolution=f'{h}x{w}' if h != w else h, layers=d['num_layers'], hidden=d['embed_dims'],
                mlp=d['mlp_dims'], heads=d['num_heads'], tokens=vit.patch_grid[0] * vit.patch_grid[1]
                + vit.num_prefix_tokens, params=params, gflops=macs / 1e9, paper_params='-')


class _BackboneThenHead(nn.Module):
    """Runs a classifier's tensor path (``extract_feat`` then the head's logits) for FLOP counting."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, x):
        feats = self.model.extract_feat(x) if hasattr(self.model, 'extract_feat') else self.model(x)
        head = getattr(self.model, 'head', None)
        # Classification heads (mmpretrain's ClsHead family, recognisable by pre_logits) map features
        # to logits; other heads (self-supervised losses) need more than features and are skipped.
        return head(feats) if head is not None and hasattr(head, 'pre_logits') else feats
