"""Few-shot linear evaluation of the paper (docs/evaluation.md#few-shot-linear-evaluation)."""
import math
from typing import Dict, Optional, Sequence, Tuple

import numpy as np
import torch

from vit_plugin.datasets.label_subset import as_labels, sample_k_shot

#: Regularisers tried by default: 2^-10 ... 2^19 (on standardised features).
DEFAULT_L2_GRID = tuple(2.0**i for i in range(-10, 20))


def _as_float64(array) -> torch.Tensor:
    if isinstance(array, np.ndarray):
        array = torch.from_numpy(array)
    return torch.as_tensor(array).detach().to('cpu', torch.float64)


def signed_one_hot(labels, num_classes: int) -> torch.Tensor:
    """Class indices -> targets in {-1, 1}^K (1 for the true class, -1 elsewhere), float64."""
    labels = torch.as_tensor(as_labels(labels))
    if labels.numel() and int(labels.max()) >= num_classes:
        raise ValueError(f'label {int(labels.max())} is out of range for num_classes={num_classes}')
    targets = torch.full((labels.numel(), num_classes), -1.0, dtype=torch.float64)
    targets[torch.arange(labels.numel()), labels] = 1.0
    return targets


class RidgeSolver:
    """Closed-form ridge ``min ||X W + b - Y||^2 + l2 ||W||^2`` (bias free) for any l2, from one float64 SVD.

    ``features`` (N, D), ``targets`` (N, K); ``standardize`` with the support statistics (+ ``eps``)."""

    def __init__(self, features, targets, standardize: bool = True, eps: float = 1e-6):
        x, y = _as_float64(features), _as_float64(targets)
        if x.dim() != 2 or y.dim() != 2 or x.shape[0] != y.shape[0]:
            raise ValueError(f'expected features (N, D) and targets (N, K) with the same N, got '
                             f'{tuple(x.shape)} and {tuple(y.shape)}')
        if x.shape[0] == 0:
            raise ValueError('cannot fit a linear probe on an empty support set')
        if not torch.isfinite(x).all():
            raise ValueError('the support features contain NaN or Inf; the model produces non-finite '
                             'features (check the checkpoint and the input normalisation)')
        self.mean = x.mean(0, keepdim=True)
        self.scale = x.std(0, unbiased=False, keepdim=True) + eps if standardize else torch.ones_like(self.mean)
        self.y_mean = y.mean(0, keepdim=True)
        xc = (x - self.mean) / self.scale
        u, s, vh = torch.linalg.svd(xc, full_matrices=False)
        self._v, self._s = vh.T, s
        self._cutoff = float(s.max()) * max(xc.shape) * torch.finfo(torch.float64).eps if s.numel() else 0.0
        self._uty = u.T @ (y - self.y_mean)

    def coef(self, l2: float) -> Tuple[torch.Tensor, torch.Tensor]:
        """Weights (D, K) and bias (K,) in the original (un-standardised) feature space."""
        if l2 < 0:
            raise ValueError(f'the regulariser must be >= 0, got {l2}')
        s = self._s
        # Directions with (numerically) zero singular value carry no information: they get zero
        # weight, so with l2 == 0 this is the minimum-norm least-squares solution (as lstsq/pinv).
        # Centring alone makes the support rank-deficient by one.
        keep = s > self._cutoff
        factor = torch.where(keep, s / torch.where(keep, s * s + l2, torch.ones_like(s)), torch.zeros_like(s))
        w_std = self._v @ (factor[:, None] * self._uty)
        weights = w_std / self.scale.T
        bias = self.y_mean[0] - (self.mean @ weights)[0]
        return weights, bias

    def predict(self, features, l2: float) -> torch.Tensor:
        """Regression outputs (M, K) for features (M, D)."""
        weights, bias = self.coef(l2)
        return _as_float64(features) @ weights + bias

    def accuracy(self, features, labels, l2: float) -> float:
        """Top-1 accuracy in percent of the argmax of :meth:`predict`."""
        labels = torch.as_tensor(as_labels(labels))
        if labels.numel() == 0:
            raise ValueError('cannot measure accuracy on an empty set')
        pred = self.predict(features, l2).argmax(1)
        return float((pred == labels).double().mean() * 100)


def select_l2(solver: RidgeSolver, features, labels, l2_grid: Sequence[float] = DEFAULT_L2_GRID) -> Tuple[float, float]:
    """(l2 of ``l2_grid`` with the best accuracy on ``(features, labels)``, ties the largest; accuracy in %)."""
    best = (-1.0, 0.0)
    for l2 in sorted(l2_grid):
        acc = solver.accuracy(features, labels, l2)
        if acc >= best[0]:
            best = (acc, l2)
    return best[1], best[0]


def fewshot_linear_eval(support_feats,
                        support_labels,
                        query_feats,
                        query_labels,
                        shots: Sequence[int] = (1, 5, 10, 25),
                        seed: int = 0,
                        num_holdout_per_class: int = 2,
                        l2_grid: Sequence[float] = DEFAULT_L2_GRID,
                        num_classes: Optional[int] = None,
                        standardize: bool = True) -> Dict[int, dict]:
    """Few-shot linear top-1 accuracy of ``query`` after ``k``-shot draws of ``support``, for every shot.

    ``num_holdout_per_class`` support samples per class choose the regulariser of ``l2_grid`` (0: one
    value only). Returns shot -> dict(top1 (%), l2, holdout_top1 (% or None), num_support=k * K)."""
    support_labels, query_labels = as_labels(support_labels), as_labels(query_labels)
    if num_classes is None:
        num_classes = int(max(support_labels.max(initial=-1), query_labels.max(initial=-1))) + 1
    if num_holdout_per_class == 0 and len(l2_grid) != 1:
        raise ValueError('without a held-out split (num_holdout_per_class=0) the regulariser cannot be '
                         'chosen; pass a single value, e.g. l2_grid=(1.0,), or num_holdout_per_class >= 1')
    support_feats = _as_float64(support_feats)
    subsets, holdout = sample_k_shot(support_labels, shots, seed, num_holdout_per_class, num_classes)
    results = {}
    for k, idx in subsets.items():
        solver = RidgeSolver(support_feats[idx], signed_one_hot(support_labels[idx], num_classes),
                             standardize=standardize)
        if len(holdout):
            l2, holdout_acc = select_l2(solver, support_feats[holdout], support_labels[holdout], l2_grid)
        else:
            l2, holdout_acc = float(l2_grid[0]), None
        results[k] = dict(top1=solver.accuracy(query_feats, query_labels, l2), l2=l2,
                          holdout_top1=holdout_acc, num_support=len(idx))
    return results


def format_results(results: Dict[int, dict]) -> Dict[str, float]:
    """Flatten :func:`fewshot_linear_eval` output into metric names: ``5shot_top1``, ``5shot_log2_l2``."""
    metrics = {}
    for k, res in sorted(results.items()):
        metrics[f'{k}shot_top1'] = res['top1']
        metrics[f'{k}shot_log2_l2'] = math.log2(res['l2']) if res['l2'] > 0 else float('-inf')
    return metrics
