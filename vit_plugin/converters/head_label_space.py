"""A whole-classifier state dict with its head put in another label space (docs/checkpoints.md#label-spaces)."""
from typing import Dict, Optional, Sequence, Tuple

import torch

from ..label_spaces import canonical_name, index_map, num_classes, synsets
from ..models.heads import describe_remap, remap_head_rows
from .common import HEAD_PREFIX, ConversionError, ConversionReport


def parse_label_space_pair(text: str) -> Tuple[str, str]:
    """``'google21k:fall11'`` -> canonical ``('google21k', 'fall11')``; ConversionError otherwise."""
    parts = text.split(':')
    if len(parts) != 2 or not all(parts):
        raise ConversionError(f'--head-label-space takes SRC:DST (e.g. google21k:fall11), got {text!r}')
    try:
        return canonical_name(parts[0]), canonical_name(parts[1])
    except ValueError as err:
        raise ConversionError(f'--head-label-space {text}: {err}') from None


def _remap_classes(classes: Sequence[str], index, dst: str) -> list:
    """Class names reordered with the rows; a class the source lacks is named by its synset."""
    dst_synsets = synsets(dst)
    return [classes[i] if i >= 0 else dst_synsets[row] for row, i in enumerate(index.tolist())]


def convert_head_label_space(state_dict: Dict[str, torch.Tensor],
                             src: str,
                             dst: str,
                             head_prefix: str = HEAD_PREFIX + 'head.',
                             classes: Optional[Sequence[str]] = None,
                             report: Optional[ConversionReport] = None):
    """Reorder the classifier of ``state_dict`` from label space ``src`` to ``dst`` (missing rows zero).

    Args:
        state_dict (dict): Our whole-classifier layout.
        src (str): The label space of the classifier's rows.
        dst (str): The label space to give them.
        head_prefix (str): Where the classifier sits. Defaults to 'head.layers.head.'.
        classes (sequence of str, optional): Class names in ``src`` order, reordered with the rows.
        report (ConversionReport, optional): Report to extend. Defaults to a new one.

    Returns:
        tuple: (new state dict, the report, the reordered class names or None).

    Raises:
        ConversionError: No classifier under ``head_prefix``, or another row count than ``src``'s.
    """
    src, dst = canonical_name(src), canonical_name(dst)
    report = report or ConversionReport(source='state dict')
    key = head_prefix + 'weight'
    weight = state_dict.get(key)
    if weight is None:
        raise ConversionError(f'{report.source}: no classifier {key!r} to put in label space {dst}; convert a '
                              f'whole-classifier checkpoint, without --num-classes or --backbone-only')
    if weight.shape[0] != num_classes(src):
        raise ConversionError(f'{key}: the classifier has {weight.shape[0]} rows but label space {src} has '
                              f'{num_classes(src)} classes; name the space its rows follow as SRC')
    if classes is not None and len(classes) != weight.shape[0]:
        raise ConversionError(f'{report.source}: the checkpoint names {len(classes)} classes but its classifier has '
                              f'{weight.shape[0]} rows; its class names cannot follow the rows')
    index = index_map(dst, src)
    out = dict(state_dict)
    out[key], bias = remap_head_rows(weight, state_dict.get(head_prefix + 'bias'), index)
    if bias is not None:
        out[head_prefix + 'bias'] = bias
    report.resized.append(f'{key}: label space {src} ({weight.shape[0]:,} rows) -> {dst} ({len(index):,}): '
                          f'{describe_remap(src, dst)}')
    return out, report, None if classes is None else _remap_classes(classes, index, dst)
