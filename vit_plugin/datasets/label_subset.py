"""A class-balanced, seeded subset of a labelled dataset, for label-efficiency studies.

``dict(type='vit_plugin.LabelSubsetDataset', dataset=<any labelled dataset config>, num_per_class=5,
seed=0)`` keeps ``num_per_class`` samples of every class and nothing else, so that "fine-tune with 5
labels per class" is one line of a config. The draw is :func:`sample_k_shot`, the one home of
class-balanced sampling (the few-shot evaluation draws its support sets with it too), which makes
subsets *nested*: with the same seed the 1-per-class subset lies inside the 5-per-class one, which
lies inside the 10-per-class one, so the curve of accuracy against labels compares training sets
that only grow. Any sampler (``InfiniteSampler``, ``DefaultSampler``) then draws from the subset.
"""
import copy
from typing import Dict, Optional, Sequence, Tuple, Union

import numpy as np
import torch
from mmengine.dataset import BaseDataset
from mmengine.registry import DATASETS as MMENGINE_DATASETS

from vit_plugin.registry import DATASETS


def as_labels(labels) -> np.ndarray:
    """``labels`` (array-like or tensor) as a flat int64 array of class indices; an error for negative
    or non-integer values."""
    labels = np.asarray(labels.cpu() if isinstance(labels, torch.Tensor) else labels).reshape(-1)
    if labels.size and (labels.min() < 0 or not np.issubdtype(labels.dtype, np.integer)):
        raise ValueError(f'labels must be non-negative integers (class indices), got dtype {labels.dtype} '
                         f'with minimum {labels.min()}')
    return labels.astype(np.int64)


def sample_k_shot(labels,
                  shots: Sequence[int],
                  seed: int = 0,
                  num_holdout_per_class: int = 0,
                  num_classes: Optional[int] = None) -> Tuple[Dict[int, np.ndarray], np.ndarray]:
    """Seeded, class-balanced k-shot subsets of a labelled pool, plus a disjoint held-out split.

    Each class's pool indices are shuffled once with the seed; the first ``num_holdout_per_class``
    become the held-out split and the k-shot subset takes the next ``k``. Subsets are therefore nested
    (1-shot within 5-shot within 10-shot ...) and never overlap the held-out split.

    Args:
        labels (array-like): Class index of every pool sample (M,).
        shots (Sequence[int]): Shot counts, e.g. ``(1, 5, 10, 25)``.
        seed (int): Seed of the draw; the same seed gives the same subsets. Defaults to 0.
        num_holdout_per_class (int): Held-out samples per class (for choosing the regulariser).
            Defaults to 0.
        num_classes (int, optional): Number of classes; every class in ``range(num_classes)`` must have
            enough samples. Defaults to None: the classes present in ``labels``.

    Returns:
        tuple: (dict shot -> sorted pool indices (k * classes,), sorted held-out indices).

    Raises:
        ValueError: if a class has fewer than ``max(shots) + num_holdout_per_class`` samples.
    """
    labels = as_labels(labels)
    shots = sorted({int(k) for k in shots})
    if not shots or shots[0] < 1:
        raise ValueError(f'shots must be positive integers, got {shots}')
    classes = np.arange(num_classes) if num_classes is not None else np.unique(labels)
    needed = shots[-1] + num_holdout_per_class
    rng = np.random.default_rng(seed)
    subsets = {k: [] for k in shots}
    holdout = []
    short = []
    for cls in classes:
        members = np.flatnonzero(labels == cls)
        if len(members) < needed:
            short.append(f'class {int(cls)}: {len(members)}')
            continue
        members = rng.permutation(members)
        holdout.extend(members[:num_holdout_per_class])
        for k in shots:
            subsets[k].extend(members[num_holdout_per_class:num_holdout_per_class + k])
    if short:
        raise ValueError(f'{max(shots)}-shot sampling with {num_holdout_per_class} held-out samples per class '
                         f'needs {needed} samples of every class in the support pool, but '
                         f'{", ".join(short[:10])}{" ..." if len(short) > 10 else ""}. Use fewer shots, '
                         f'a smaller held-out split, or a larger support dataset.')
    return {k: np.sort(np.asarray(v, dtype=np.int64)) for k, v in subsets.items()}, np.sort(
        np.asarray(holdout, dtype=np.int64))


def labels_of(dataset) -> np.ndarray:
    """The class index of every sample of a single-label dataset (mmpretrain's ``get_gt_labels`` or
    mmengine's ``get_cat_ids``)."""
    if hasattr(dataset, 'get_gt_labels'):
        return np.asarray(dataset.get_gt_labels(), dtype=np.int64)
    labels = []
    for idx in range(len(dataset)):
        cat_ids = list(dataset.get_cat_ids(idx))
        if len(cat_ids) != 1:
            raise ValueError(f'LabelSubsetDataset needs one label per sample; sample {idx} has {cat_ids}')
        labels.append(cat_ids[0])
    return np.asarray(labels, dtype=np.int64)


def class_balanced_indices(labels, num_per_class: int, seed: int = 0) -> np.ndarray:
    """Sorted indices of ``num_per_class`` samples of every class present in ``labels``, seeded and
    nested across ``num_per_class`` (see the module docstring)."""
    subsets, _ = sample_k_shot(labels, shots=[num_per_class], seed=seed)
    return subsets[num_per_class]


@DATASETS.register_module()
class LabelSubsetDataset:
    """``num_per_class`` samples of every class of ``dataset``, drawn with ``seed``.

    Args:
        dataset (BaseDataset | dict): The labelled dataset or its config (built in the current scope,
            so ``type='ImageNet'`` means mmpretrain's in an mmpretrain config).
        num_per_class (int, optional): Samples kept per class. None keeps every sample (the "all
            labels" arm of a study, with the same wrapper in the config). Defaults to None.
        seed (int): Seed of the draw; subsets of one seed are nested. Defaults to 0.
        lazy_init (bool): Defer building the index until first use, as mmengine's wrappers do.
            Defaults to False.

    Raises:
        ValueError: if a class has fewer than ``num_per_class`` samples (the message names it).
    """

    def __init__(self, dataset: Union[BaseDataset, dict], num_per_class: Optional[int] = None, seed: int = 0,
                 lazy_init: bool = False):
        if isinstance(dataset, dict):
            dataset = MMENGINE_DATASETS.build(dataset)
        if num_per_class is not None and (not isinstance(num_per_class, int) or num_per_class < 1):
            raise ValueError(f'num_per_class must be a positive integer or None (all samples), '
                             f'got {num_per_class!r}')
        self.dataset = dataset
        self.num_per_class = num_per_class
        self.seed = seed
        self._metainfo = copy.deepcopy(dataset.metainfo)
        self._fully_initialized = False
        if not lazy_init:
            self.full_init()

    @property
    def metainfo(self) -> dict:
        return copy.deepcopy(self._metainfo)

    def full_init(self):
        if self._fully_initialized:
            return
        self.dataset.full_init()
        labels = labels_of(self.dataset)
        if self.num_per_class is None:
            self.indices = np.arange(len(labels))
        else:
            self.indices = class_balanced_indices(labels, self.num_per_class, self.seed)
        self.labels = labels[self.indices]
        self._fully_initialized = True

    def _inner(self, idx: int) -> int:
        if not self._fully_initialized:
            self.full_init()
        return int(self.indices[idx])

    def get_data_info(self, idx: int) -> dict:
        return self.dataset.get_data_info(self._inner(idx))

    def get_cat_ids(self, idx: int):
        return self.dataset.get_cat_ids(self._inner(idx))

    def get_gt_labels(self) -> np.ndarray:
        if not self._fully_initialized:
            self.full_init()
        return self.labels.copy()

    def __getitem__(self, idx: int):
        return self.dataset[self._inner(idx)]

    def __len__(self) -> int:
        if not self._fully_initialized:
            self.full_init()
        return len(self.indices)

    def __repr__(self) -> str:
        kept = 'all' if self.num_per_class is None else f'{self.num_per_class} per class'
        return f'LabelSubsetDataset({kept}, seed={self.seed}, {len(self)} of {len(self.dataset)} samples)'
