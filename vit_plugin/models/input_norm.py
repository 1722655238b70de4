"""Does the model normalise inputs as its weights expect? (docs/checkpoints.md#numerics-records)"""
import logging
from typing import List, Optional, Tuple

import torch
import torch.nn as nn
from mmengine.logging import print_log

from vit_plugin.compat import mmengine as mmengine_compat

#: Pixel units (0..255): differences below this are rounding, not another normalisation.
TOLERANCE = 0.5


def preprocessor_norm(model: nn.Module) -> Optional[Tuple[Tuple[float, ...], Tuple[float, ...]]]:
    """``(mean, std)`` the model's data preprocessor applies, or None when it does not normalise."""
    pre = getattr(model, 'data_preprocessor', None)
    if pre is None or not mmengine_compat.normalizes(pre):
        return None
    mean, std = (torch.as_tensor(getattr(pre, name)).flatten().double().tolist() for name in ('mean', 'std'))
    return tuple(round(v, 4) for v in mean), tuple(round(v, 4) for v in std)


def _differs(a, b) -> bool:
    return len(a) != len(b) or any(abs(x - y) > TOLERANCE for x, y in zip(a, b))


def check_input_normalization(model: nn.Module, warn: bool = True) -> List[str]:
    """One message (logged if ``warn``) per ViT whose ``expected_input_norm`` differs from the preprocessor's."""
    model = getattr(model, 'module', model)  # DDP and friends
    recorded = [(name, module.expected_input_norm) for name, module in model.named_modules()
                if getattr(module, 'expected_input_norm', None) is not None]
    if not recorded:  # nothing to compare: do not read the preprocessor's tensors (a device read on XLA)
        return []
    applied = preprocessor_norm(model)
    messages = []
    for name, expected in recorded:
        if applied is not None and not _differs(expected[0], applied[0]) and not _differs(expected[1], applied[1]):
            continue
        mean, std = (list(v) for v in expected)
        given = ('does not normalise its inputs' if applied is None else
                 f'normalises with mean={list(applied[0])}, std={list(applied[1])}')
        messages.append(
            f'{name or type(model).__name__}: its weights were trained on inputs normalised with mean={mean}, '
            f'std={std} (recorded in the checkpoint), but model.data_preprocessor {given}. The model then sees '
            f'inputs on another scale than in training and loses accuracy without failing. Set '
            f'model.data_preprocessor mean={mean} and std={std} (e.g. --cfg-options '
            f'model.data_preprocessor.mean="{mean}" model.data_preprocessor.std="{std}").')
    if warn:
        for message in messages:
            print_log(message, logger='current', level=logging.WARNING)
    return messages
