"""Fine-tuning transfer as the paper does it: drop the pre-training head, attach a zero-initialised one."""
from typing import Dict, Optional, Tuple

import torch

from .common import BACKBONE_PREFIX, HEAD_PREFIX, ConversionError, ConversionReport, head_in_features


def finetune_transfer(state_dict: Dict[str, torch.Tensor],
                      num_classes: int,
                      keep_pre_logits: bool = False,
                      backbone_prefix: str = BACKBONE_PREFIX,
                      head_prefix: str = HEAD_PREFIX,
                      report: Optional[ConversionReport] = None) -> Tuple[Dict[str, torch.Tensor], ConversionReport]:
    """Replace the classification head of a whole-classifier state dict by a zero one.

    Args:
        state_dict (dict): Our whole-classifier layout (``backbone.*``, ``head.layers.*``).
        num_classes (int): Downstream classes.
        keep_pre_logits (bool): Keep the ``pre_logits`` layer (the paper drops it). Defaults to False.
        backbone_prefix (str): Defaults to 'backbone.'.
        head_prefix (str): Defaults to 'head.layers.'.
        report (ConversionReport, optional): Report to extend. Defaults to a new one.

    Returns:
        tuple: (new state dict with a zero ``head.layers.head`` of ``num_classes`` rows, the report).
    """
    if num_classes <= 0:
        raise ConversionError(f'num_classes must be positive, got {num_classes}')
    report = report or ConversionReport(source='state dict')
    out = {}
    for key, value in state_dict.items():
        is_head = key.startswith(head_prefix + 'head.')
        is_pre_logits = key.startswith(head_prefix + 'pre_logits.')
        if is_head or (is_pre_logits and not keep_pre_logits):
            report.dropped.append(key)
            if key in report.loaded:
                report.loaded.remove(key)
            continue
        out[key] = value
    in_features = head_in_features(out, head_prefix, backbone_prefix)
    if in_features is None:
        raise ConversionError(f'cannot size the new head: the state dict has no {backbone_prefix}pos_embed '
                              f'(or {head_prefix}pre_logits.weight); pass a whole-classifier state dict')
    dtype = out[backbone_prefix + 'pos_embed'].dtype if backbone_prefix + 'pos_embed' in out else torch.float32
    out[head_prefix + 'head.weight'] = torch.zeros(num_classes, in_features, dtype=dtype)
    out[head_prefix + 'head.bias'] = torch.zeros(num_classes, dtype=dtype)
    report.loaded += [head_prefix + 'head.weight', head_prefix + 'head.bias']
    return out, report
