"""A ViT's numerics (GELU, LayerNorm eps, input norm) and their records (docs/checkpoints.md#numerics-records)."""
import logging
import struct
from typing import Dict, List, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn
from mmengine.logging import print_log

from vit_plugin.checkpoint.records import (GELU_KEY, NORM_EPS_KEY, NORM_KEY, decode_gelu, decode_input_norm,
                                          decode_norm_eps, encode_gelu, encode_input_norm, encode_norm_eps)

#: What a checkpoint's numerics record does when it differs from the model (the ``checkpoint_numerics``
#: keyword of ``vit_plugin.ViT``).
CHECKPOINT_NUMERICS = ('from_checkpoint', 'keep', 'error')

InputNorm = Tuple[Tuple[float, ...], Tuple[float, ...]]


def parse_input_norm(value: Union[None, dict, Sequence]) -> Optional[InputNorm]:
    """``expected_input_norm`` (dict, (mean, std) pair or None) -> ``((mean,) * 3, (std,) * 3)``, 0..255 units."""
    if value is None:
        return None
    if isinstance(value, dict):
        if set(value) - {'mean', 'std', 'to_rgb'} or not {'mean', 'std'} <= set(value):
            raise ValueError(f'expected_input_norm: give dict(mean=[...], std=[...]) in 0..255 units (as the '
                             f'data preprocessor), got keys {sorted(value)}')
        mean, std = value['mean'], value['std']
    else:
        mean, std = value
    mean, std = [float(v) for v in mean], [float(v) for v in std]  # no tensor: models are built on 'meta' too
    if len(mean) != 3 or len(std) != 3 or min(std) <= 0:
        raise ValueError(f'expected_input_norm: expected 3 means and 3 positive stds (0..255 units), got '
                         f'mean={mean}, std={std}')
    # stored as float32 and rounded, as a checkpoint's record is read (decode_input_norm)
    def as_read(v: float) -> float:
        return round(struct.unpack('f', struct.pack('f', v))[0], 4)
    return tuple(as_read(v) for v in mean), tuple(as_read(v) for v in std)


def _gelus(model) -> List[nn.GELU]:
    return [m for m in model.blocks.modules() if isinstance(m, nn.GELU)]


def _layer_norms(model) -> List[nn.LayerNorm]:
    return [m for m in model.modules() if isinstance(m, nn.LayerNorm)]


def record_gelu(model, state_dict, prefix, local_metadata) -> None:
    """State-dict post-hook: record the tanh GELU with the weights (exact GELU needs no record)."""
    if any(gelu.approximate == 'tanh' for gelu in _gelus(model)):
        state_dict[prefix + GELU_KEY] = encode_gelu('tanh')


def record_norm_eps(model, state_dict, prefix, local_metadata) -> None:
    """State-dict post-hook: save again the LayerNorm eps a checkpoint recorded."""
    if model.recorded_norm_eps is not None:
        state_dict[prefix + NORM_EPS_KEY] = encode_norm_eps(model.recorded_norm_eps)


def record_input_norm(model, state_dict, prefix, local_metadata) -> None:
    """State-dict post-hook: save the input normalisation the weights expect."""
    if model.expected_input_norm is not None:
        state_dict[prefix + NORM_KEY] = encode_input_norm(*model.expected_input_norm)


def _eps_text(values) -> str:
    return ', '.join(f'{v:g}' for v in values)


def _norm_text(norm: Optional[InputNorm]) -> str:
    if norm is None:
        return 'none declared'
    mean, std = norm
    return f'mean={list(mean)} std={list(std)}'


def apply_checkpoint_numerics(model, state_dict: Dict[str, torch.Tensor], prefix: str = '',
                              policy: Optional[str] = None) -> List[str]:
    """Consume the numerics records under ``prefix`` and apply them to ``model`` as ``policy`` says.

    ``policy``: one of :data:`CHECKPOINT_NUMERICS`, default the model's. Returns the warnings logged.

    Raises:
        ValueError: Under ``'error'``, a record differs from the model.
    """
    policy = model.checkpoint_numerics if policy is None else policy
    name = type(model).__name__
    gelu = state_dict.pop(prefix + GELU_KEY, None)
    eps = state_dict.pop(prefix + NORM_EPS_KEY, None)
    norm = state_dict.pop(prefix + NORM_KEY, None)
    gelus, norms = _gelus(model), _layer_norms(model)
    # (keyword, the model's value as text, the record's as text, how to apply the record)
    differ = []
    if gelu is not None:
        approximate = decode_gelu(gelu, prefix + GELU_KEY)
        built = sorted({g.approximate for g in gelus})
        if built != [approximate]:
            def set_gelu(value=approximate):
                for module in gelus:
                    module.approximate = value
            differ.append(('gelu_approximate', 'GELU approximate', ', '.join(repr(b) for b in built),
                           repr(approximate), set_gelu))
    if eps is not None:
        value = decode_norm_eps(eps, prefix + NORM_EPS_KEY)
        built = sorted({n.eps for n in norms})
        if built == [value]:
            model.recorded_norm_eps = value  # the weights say so: saved with them again
        else:
            def set_eps(value=value):
                for module in norms:
                    module.eps = value
                model.recorded_norm_eps = value
            differ.append(('norm_eps', 'LayerNorm eps', _eps_text(built), f'{value:g}', set_eps))
    if norm is not None:
        recorded = decode_input_norm(norm, prefix + NORM_KEY)
        if model.expected_input_norm is None and policy != 'keep':
            # nothing declared to differ from: the model learns what its inputs must be (the data
            # preprocessor is checked against it, vit_plugin.models.check_input_normalization)
            model.expected_input_norm = recorded
            print_log(f'{name}: expected input normalisation {_norm_text(recorded)} from the checkpoint\'s record '
                      f'({prefix}{NORM_KEY}); checked against the data preprocessor.', logger='current',
                      level=logging.INFO)
        elif model.expected_input_norm != recorded:
            def set_norm(value=recorded):
                model.expected_input_norm = value
            differ.append(('expected_input_norm', 'expected input normalisation',
                           _norm_text(model.expected_input_norm), _norm_text(recorded), set_norm))
    if not differ:
        return []
    if policy == 'error':
        found = '; '.join(f'{keyword}: config {ours}, checkpoint {theirs}' for keyword, _, ours, theirs, _ in differ)
        raise ValueError(f'{prefix.rstrip(".") or name}: the checkpoint records other numerics ({found}) and '
                         f"checkpoint_numerics='error'. Set those keywords to the checkpoint's values, or "
                         f"checkpoint_numerics='from_checkpoint' to adopt them, 'keep' to ignore them.")
    if policy == 'keep':
        kept = ', '.join(f'{what} {ours} (checkpoint: {theirs})' for _, what, ours, theirs, _ in differ)
        print_log(f"{name}: checkpoint_numerics='keep': the model keeps its {kept}.", logger='current',
                  level=logging.INFO)
        return []
    messages = []
    for keyword, what, ours, theirs, apply in differ:
        apply()
        messages.append(f"{name}: {what} {ours} -> {theirs} from the checkpoint's record "
                        f"({prefix}{_record_key(keyword)}; checkpoint_numerics='keep' pins the config's "
                        f'{keyword})')
        print_log(messages[-1], logger='current', level=logging.WARNING)
    return messages


def _record_key(keyword: str) -> str:
    return {'gelu_approximate': GELU_KEY, 'norm_eps': NORM_EPS_KEY, 'expected_input_norm': NORM_KEY}[keyword]
