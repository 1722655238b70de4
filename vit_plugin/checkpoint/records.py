"""A ViT state dict's records besides weights, as tensors; imports nothing from the package.

Backbone-relative :data:`MODE_KEY`, :data:`GELU_KEY`, :data:`NORM_KEY` ((2, 3) mean/std, 0..255),
:data:`NORM_EPS_KEY` (float64); integer codes index frozen tables (docs/checkpoints.md#numerics-records)."""
from typing import Dict, Optional, Sequence, Tuple

import torch

MODE_KEY = 'pos_embed_resize_mode'
#: On-disk meaning of the integer under :data:`MODE_KEY` (append only, never reorder).
RECORDED_RESIZE_MODES = ('official', 'bilinear', 'bicubic')

GELU_KEY = 'gelu_approximate'
#: On-disk meaning of the integer under :data:`GELU_KEY` (append only, never reorder).
RECORDED_GELUS = ('none', 'tanh')

NORM_KEY = 'input_normalization'
#: What the official JAX weights expect: ``(x - 127.5) / 127.5`` maps 0..255 pixels to [-1, 1].
OFFICIAL_INPUT_NORM = ((127.5, 127.5, 127.5), (127.5, 127.5, 127.5))

NORM_EPS_KEY = 'layer_norm_eps'

#: Keys relative to the backbone that hold records, not weights.
RECORD_KEYS = (MODE_KEY, GELU_KEY, NORM_KEY, NORM_EPS_KEY)


def _encode(value: str, table: Sequence[str], key: str) -> torch.Tensor:
    if value not in table:
        raise ValueError(f'{key}: cannot record {value!r}; choose one of {tuple(table)}')
    return torch.tensor(table.index(value), dtype=torch.long)


def _decode(value, table: Sequence[str], key: str) -> str:
    index = int(value) if torch.is_tensor(value) and value.numel() == 1 else -1
    if not 0 <= index < len(table):
        raise ValueError(f'{key}: expected a scalar index into {tuple(table)}, got {value!r}; the file was '
                         f'written by a newer version or edited by hand. Delete the key to use the model\'s own '
                         f'setting.')
    return table[index]


def encode_resize_mode(mode: str) -> torch.Tensor:
    """The tensor stored under :data:`MODE_KEY` for ``mode``."""
    return _encode(mode, RECORDED_RESIZE_MODES, MODE_KEY)


def decode_resize_mode(value: torch.Tensor, key: str = MODE_KEY) -> str:
    """Inverse of :func:`encode_resize_mode`; a clear error for anything else."""
    return _decode(value, RECORDED_RESIZE_MODES, key)


def encode_gelu(approximate: str) -> torch.Tensor:
    """The tensor stored under :data:`GELU_KEY` for ``approximate`` ('none' or 'tanh')."""
    return _encode(approximate, RECORDED_GELUS, GELU_KEY)


def decode_gelu(value: torch.Tensor, key: str = GELU_KEY) -> str:
    """Inverse of :func:`encode_gelu`; a clear error for anything else."""
    return _decode(value, RECORDED_GELUS, key)


def encode_input_norm(mean: Sequence[float], std: Sequence[float]) -> torch.Tensor:
    """The tensor stored under :data:`NORM_KEY`: ``[mean, std]`` per RGB channel, 0..255 units."""
    mean, std = [float(v) for v in mean], [float(v) for v in std]
    if len(mean) != 3 or len(std) != 3 or min(std) <= 0:
        raise ValueError(f'{NORM_KEY}: expected 3 means and 3 positive stds (0..255 units), got mean={mean}, '
                         f'std={std}')
    return torch.tensor([mean, std], dtype=torch.float32)


def decode_input_norm(value, key: str = NORM_KEY) -> Tuple[Tuple[float, ...], Tuple[float, ...]]:
    """Inverse of :func:`encode_input_norm`: ``(mean, std)``; a clear error for anything else."""
    if not (torch.is_tensor(value) and tuple(value.shape) == (2, 3) and bool(torch.isfinite(value).all())
            and bool((value[1] > 0).all())):
        raise ValueError(f'{key}: expected a (2, 3) tensor [mean, std] in 0..255 units, got {value!r}; the file '
                         'was written by a newer version or edited by hand. Delete the key to skip the check.')
    mean, std = value.double().tolist()
    return tuple(round(v, 4) for v in mean), tuple(round(v, 4) for v in std)


def encode_norm_eps(eps: float) -> torch.Tensor:
    """The tensor stored under :data:`NORM_EPS_KEY` for a LayerNorm epsilon."""
    eps = float(eps)
    if not 0 < eps < 1:
        raise ValueError(f'{NORM_EPS_KEY}: cannot record {eps!r}; a LayerNorm epsilon is in (0, 1)')
    return torch.tensor(eps, dtype=torch.float64)


def decode_norm_eps(value, key: str = NORM_EPS_KEY) -> float:
    """Inverse of :func:`encode_norm_eps`; a clear error for anything else."""
    eps = float(value) if torch.is_tensor(value) and value.numel() == 1 and value.is_floating_point() else -1.0
    if not 0 < eps < 1:
        raise ValueError(f'{key}: expected a scalar LayerNorm epsilon in (0, 1), got {value!r}; the file was '
                         f'written by a newer version or edited by hand. Delete the key to use the model\'s own '
                         f'setting.')
    return eps


def resize_mode_for(state_dict: Dict[str, torch.Tensor], prefix: str, fallback: str,
                    override: Optional[str] = None, consume: bool = False,
                    fallback_name: str = 'the default') -> Tuple[str, str]:
    """(position-table resize mode, its source for log lines): ``override``, else the record (removed if
    ``consume``), else ``fallback`` (called ``fallback_name``)."""
    key = prefix + MODE_KEY
    recorded = state_dict.pop(key, None) if consume else state_dict.get(key)
    if override is not None:
        return override, 'chosen explicitly'
    if recorded is not None:
        return decode_resize_mode(recorded, key), 'recorded in the checkpoint'
    return fallback, fallback_name
