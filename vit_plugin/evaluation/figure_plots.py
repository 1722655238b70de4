"""PNG figures of the paper's Figures 6 and 7 (matplotlib, no display needed)."""
import math
import os
import os.path as osp
from typing import Dict, List, Optional, Sequence

import numpy as np
import torch

from vit_plugin.evaluation.model_complexity import format_gflops


def _plt():
    import matplotlib

    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    return plt


def _save(fig, out: str, dpi: int = 100) -> str:
    os.makedirs(osp.dirname(osp.abspath(out)), exist_ok=True)
    fig.savefig(out, dpi=dpi, bbox_inches='tight')
    _plt().close(fig)
    if not osp.isfile(out) or osp.getsize(out) == 0:
        raise RuntimeError(f'matplotlib wrote no image to {out}')
    return out


def _grid_shape(n: int, cols: Optional[int] = None):
    cols = cols or math.ceil(math.sqrt(n))
    return math.ceil(n / cols), cols


def plot_filter_components(components: torch.Tensor, explained: torch.Tensor, out: str, title: str = '') -> str:
    """RGB tiles of principal components (k, C, ph, pw), each scaled to [0, 1] (Fig. 7 left)."""
    plt = _plt()
    k = components.shape[0]
    rows, cols = _grid_shape(k, min(7, k))
    fig, axes = plt.subplots(rows, cols, figsize=(cols * 1.1, rows * 1.2 + 0.4), squeeze=False)
    for i, ax in enumerate(axes.flat):
        ax.axis('off')
        if i >= k:
            continue
        tile = components[i].float()
        tile = (tile - tile.min()) / (tile.max() - tile.min()).clamp_min(1e-12)
        tile = tile.permute(1, 2, 0).numpy()
        ax.imshow(tile if tile.shape[2] == 3 else tile[..., 0], cmap=None if tile.shape[2] == 3 else 'gray',
                  interpolation='nearest')
        ax.set_title(f'{100 * float(explained[i]):.1f}%', fontsize=6)
    fig.suptitle(title or 'RGB embedding filters (top principal components)', fontsize=9)
    return _save(fig, out)


def plot_pos_embed_similarity(similarity: torch.Tensor, out: str, title: str = '') -> str:
    """A (rows x cols) grid of similarity maps, one per patch position (Fig. 7 centre)."""
    plt = _plt()
    rows, cols = similarity.shape[:2]
    fig, axes = plt.subplots(rows, cols, figsize=(cols * 0.55 + 1.0, rows * 0.55 + 0.4), squeeze=False)
    image = None
    for i in range(rows):
        for j in range(cols):
            ax = axes[i, j]
            image = ax.imshow(similarity[i, j].numpy(), vmin=-1, vmax=1, cmap='viridis', interpolation='nearest')
            ax.set_xticks([])
            ax.set_yticks([])
            if j == 0:
                ax.set_ylabel(str(i + 1), fontsize=6, rotation=0, labelpad=6)
            if i == rows - 1:
                ax.set_xlabel(str(j + 1), fontsize=6)
    fig.supxlabel('Input patch column', fontsize=8)
    fig.supylabel('Input patch row', fontsize=8)
    fig.colorbar(image, ax=axes, shrink=0.6, label='Cosine similarity')
    fig.suptitle(title or 'Position embedding similarity', fontsize=9)
    return _save(fig, out)


def plot_attention_distance(distances: torch.Tensor, out: str, image_size: Sequence[int], title: str = '') -> str:
    """Mean attention distance (layers, heads) in pixels against depth (Fig. 7 right)."""
    plt = _plt()
    layers, heads = distances.shape
    fig, ax = plt.subplots(figsize=(4.2, 3.4))
    cmap = plt.get_cmap('tab20')
    for h in range(heads):
        ax.scatter(np.arange(1, layers + 1), distances[:, h].numpy(), s=10, color=cmap(h % 20), label=f'Head {h + 1}')
    ax.set_xlabel('Network depth (layer)')
    ax.set_ylabel('Mean attention distance (pixels)')
    ax.set_ylim(0, math.hypot(*image_size))
    ax.set_xticks(range(1, layers + 1))
    if heads <= 16:
        ax.legend(fontsize=5, ncol=2, loc='lower right')
    ax.set_title(title or 'Mean attention distance', fontsize=9)
    return _save(fig, out, dpi=120)


def plot_rollout(images: np.ndarray, maps: torch.Tensor, out: str, title: str = '', max_images: int = 8) -> str:
    """Per image (B, H, W, 3): the input, the input masked by its rollout map, the map as a heat map."""
    plt = _plt()
    n = min(len(images), max_images)
    fig, axes = plt.subplots(3, n, figsize=(n * 1.4 + 0.3, 4.4), squeeze=False)
    for i in range(n):
        img = images[i]
        m = maps[i].float()[None, None]
        m = torch.nn.functional.interpolate(m, size=img.shape[:2], mode='bilinear', align_corners=False)[0, 0]
        m = (m / m.max().clamp_min(1e-12)).clamp(0, 1).numpy()
        axes[0, i].imshow(img, interpolation='nearest')
        axes[1, i].imshow(img * m[..., None], interpolation='nearest')
        axes[2, i].imshow(img.mean(-1), cmap='gray', interpolation='nearest')
        axes[2, i].imshow(m, cmap='inferno', alpha=0.6, vmin=0, vmax=1)
        for ax in axes[:, i]:
            ax.axis('off')
    for row, label in enumerate(('Input', 'Attention (masked)', 'Attention (heat map)')):
        axes[row, 0].set_title(label, fontsize=7, loc='left')
    fig.suptitle(title or 'Attention rollout from the output token to the input', fontsize=9)
    return _save(fig, out, dpi=120)


def plot_table(rows: List[Dict], columns: Dict[str, str], out: str, title: str = '') -> str:
    """Render rows of values as a table image; ``columns`` maps row keys to headers."""
    plt = _plt()
    cells = []
    for r in rows:
        cell = []
        for key in columns:
            v = r[key]
            if key == 'params' and isinstance(v, (int, np.integer)):
                v = f'{v / 1e6:.1f}M'
            elif key == 'gflops':
                v = format_gflops(v)
            elif isinstance(v, float):
                v = f'{v:.1f}'
            cell.append(str(v))
        cells.append(cell)
    fig, ax = plt.subplots(figsize=(1.0 * len(columns) + 0.5, 0.3 * len(rows) + 0.8))
    ax.axis('off')
    table = ax.table(cellText=cells, colLabels=list(columns.values()), loc='center', cellLoc='center')
    table.auto_set_font_size(False)
    table.set_fontsize(7)
    table.scale(1, 1.2)
    ax.set_title(title, fontsize=9)
    return _save(fig, out, dpi=130)
