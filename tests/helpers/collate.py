"""Collate functions of the data-loader tests. Spawned workers unpickle a collate function by its module
and name, so these live in an importable module: pytest imports test files under names that a fresh
interpreter cannot import (``--import-mode=importlib``)."""
from mmengine.dataset import pseudo_collate

from vit_plugin.datasets.skip import records_in_batch


def collate_infos(batch):
    """(image path, label, sample index) of each data info in ``batch``."""
    return [(info['img_path'], info['gt_label'], info['sample_idx']) for info in batch]


def collate_skip_records(batch):
    """The skip records (``SkipBadSamples``) that travel with ``batch``."""
    return records_in_batch(pseudo_collate(batch))
