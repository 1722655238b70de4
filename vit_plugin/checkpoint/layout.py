"""What a ViT state dict may carry besides weights, and the key names of other ViT implementations.

This module is the one place both the models' loading hook (:mod:`vit_plugin.models.load_adapt`) and
the converters (:mod:`vit_plugin.converters`) take key names from, so neither imports the other for
them. It imports nothing from the rest of the package.

Recorded fields (0-dim integer tensors, relative to the backbone): a tensor, not a string, survives
every loader, key revision and ``weights_only`` load unchanged. The integer indexes a frozen table
here, not a list that may grow elsewhere, so that a file written today decodes the same tomorrow.

* :data:`MODE_KEY` -- the position-embedding resize the weights expect (``'official'`` for the
  official JAX release). It overrides the model's ``pos_embed_load_mode``.
* :data:`GELU_KEY` -- the GELU the weights were trained with, recorded when it is the tanh
  approximation of the official Flax model (exact GELU, PyTorch's default, needs no record).
* :data:`NORM_KEY` -- the input normalisation the weights were trained with, a (2, 3) float tensor
  ``[mean, std]`` in 0..255 pixel units (the official weights: 127.5 and 127.5, inputs in [-1, 1]).
* :data:`NORM_EPS_KEY` -- the LayerNorm epsilon the weights were trained with, a 0-dim float64
  tensor, recorded when it is known to differ from the model's own (``transformers`` ports: 1e-12,
  where the official model has 1e-6).
"""
import re
from typing import Dict, Optional, Sequence, Set, Tuple

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
    """The position-embedding resize to apply to a state dict, and where the choice came from.

    The one rule every loading path and converter follows: an explicit ``override`` (the converter's
    ``--pos-embed-mode``), else the mode the weights record under ``prefix + MODE_KEY`` (the file
    knows how it was meant to be resized), else ``fallback`` (the model's ``pos_embed_load_mode``).

    Args:
        state_dict (dict): Incoming weights.
        prefix (str): Key prefix of the backbone in ``state_dict``.
        fallback (str): Mode when nothing else decides.
        override (str, optional): Mode chosen explicitly by the caller. Defaults to None.
        consume (bool): Remove the recorded key (a model consumes it; a converter keeps it). Defaults
            to False.
        fallback_name (str): What ``fallback`` is, for log lines. Defaults to 'the default'.

    Returns:
        tuple[str, str]: (mode, a few words saying where it came from, for log lines).
    """
    key = prefix + MODE_KEY
    recorded = state_dict.pop(key, None) if consume else state_dict.get(key)
    if override is not None:
        return override, 'chosen explicitly'
    if recorded is not None:
        return decode_resize_mode(recorded, key), 'recorded in the checkpoint'
    return fallback, fallback_name


# ----------------------------------------------------------------------------------------- key names
_BLOCK_WEIGHTS = r'(norm1|attn\.qkv|attn\.proj|norm2|mlp\.fc1|mlp\.fc2)\.(weight|bias)|(ls1|ls2)\.gamma'
_EMBEDDING_WEIGHTS = r'patch_embed\.proj\.(weight|bias)|cls_token|pos_embed'

#: Our backbone weight keys (relative to the backbone). They equal timm's ``VisionTransformer`` keys:
#: ``norm_pre`` (CLIP's LayerNorm before the blocks), ``blocks.i.ls1/ls2.gamma`` (layer scale) and the
#: SwiGLU MLP's ``mlp.fc1/fc2`` included; ``fc_norm`` is the LayerNorm after average pooling of
#: ``out_type='avg_featmap'``.
OURS_KEY_RE = re.compile(r'^(' + _EMBEDDING_WEIGHTS + r'|(norm|norm_pre|fc_norm)\.(weight|bias)|'
                         r'blocks\.(\d+)\.(' + _BLOCK_WEIGHTS + r'))$')

#: The keys timm and we share with one meaning: ours without ``fc_norm``. timm's ``fc_norm`` follows
#: the pooling its ``global_pool`` chose (the class token or the mean), which a state dict does not say.
TIMM_KEY_RE = re.compile(r'^(' + _EMBEDDING_WEIGHTS + r'|(norm|norm_pre)\.(weight|bias)|'
                         r'blocks\.(\d+)\.(' + _BLOCK_WEIGHTS + r'))$')

#: mmpretrain ``VisionTransformer`` name -> ours, backbone-relative, as templates: ``{i}`` is the
#: block index; an entry ending in '.' renames a prefix, any other renames the whole key. The inverse
#: direction is derived from the same pairs.
MMPRETRAIN_NAMES = (
    ('patch_embed.projection.', 'patch_embed.proj.'),
    ('layers.{i}.ln1.', 'blocks.{i}.norm1.'),
    ('layers.{i}.attn.qkv.', 'blocks.{i}.attn.qkv.'),
    ('layers.{i}.attn.proj.', 'blocks.{i}.attn.proj.'),
    ('layers.{i}.attn.gamma1.weight', 'blocks.{i}.ls1.gamma'),
    ('layers.{i}.ln2.', 'blocks.{i}.norm2.'),
    ('layers.{i}.ffn.layers.0.0.', 'blocks.{i}.mlp.fc1.'),
    ('layers.{i}.ffn.layers.1.', 'blocks.{i}.mlp.fc2.'),
    ('layers.{i}.ffn.gamma2.weight', 'blocks.{i}.ls2.gamma'),
    ('pre_norm.', 'norm_pre.'),
    ('ln1.', 'norm.'),
    ('ln2.', 'fc_norm.'),
    ('cls_token', 'cls_token'),
    ('pos_embed', 'pos_embed'),
)

#: The same for the SwiGLU MLP of ``layer_cfgs=dict(ffn_type='swiglu_fused')`` (``SwiGLUFFNFused``).
MMPRETRAIN_SWIGLU_NAMES = (
    ('layers.{i}.ffn.w12.', 'blocks.{i}.mlp.fc1.'),
    ('layers.{i}.ffn.w3.', 'blocks.{i}.mlp.fc2.'),
)


def _compile(pairs) -> Tuple[Tuple[re.Pattern, str], ...]:
    table = []
    for source, target in pairs:
        pattern = re.escape(source).replace(re.escape('{i}'), r'(\d+)')
        table.append((re.compile('^' + pattern + ('' if source.endswith('.') else '$')),
                      target.replace('{i}', r'\1')))
    return tuple(table)


_FROM_MMPRETRAIN = _compile(MMPRETRAIN_NAMES + MMPRETRAIN_SWIGLU_NAMES)
_TO_MMPRETRAIN = _compile((ours, theirs) for theirs, ours in MMPRETRAIN_NAMES)
_TO_MMPRETRAIN_SWIGLU = _compile((ours, theirs) for theirs, ours in MMPRETRAIN_SWIGLU_NAMES)


def _rename(key: str, table) -> Optional[str]:
    for pattern, repl in table:
        new, n = pattern.subn(repl, key, count=1)
        if n:
            return new
    return None


def mmpretrain_to_ours_key(key: str) -> Optional[str]:
    """Our name for a backbone-relative mmpretrain ``VisionTransformer`` key (None if it has none)."""
    new = _rename(key, _FROM_MMPRETRAIN)
    return new if new is not None and OURS_KEY_RE.match(new) else None


def ours_to_mmpretrain_key(key: str, swiglu: bool = False) -> Optional[str]:
    """mmpretrain's name for one of our backbone-relative weight keys (None if it has none).

    Args:
        key (str): Our key.
        swiglu (bool): The key's block has a SwiGLU MLP (see :func:`swiglu_blocks`), whose two dense
            layers mmpretrain names ``ffn.w12``/``ffn.w3``. Defaults to False.
    """
    if not OURS_KEY_RE.match(key):
        return None
    return (swiglu and _rename(key, _TO_MMPRETRAIN_SWIGLU)) or _rename(key, _TO_MMPRETRAIN)


def swiglu_blocks(state_dict: Dict[str, torch.Tensor], prefix: str = '') -> Set[int]:
    """Indices of the blocks of our ``state_dict`` whose MLP is SwiGLU: the packed ``mlp.fc1`` makes
    twice the width ``mlp.fc2`` takes (a GELU MLP's are equal)."""
    pattern = re.compile(re.escape(prefix) + r'blocks\.(\d+)\.mlp\.fc1\.weight$')
    found = set()
    for key, value in state_dict.items():
        match = pattern.match(key)
        fc2 = state_dict.get(f'{prefix}blocks.{match.group(1)}.mlp.fc2.weight') if match else None
        if fc2 is not None and value.shape[0] == 2 * fc2.shape[1]:
            found.add(int(match.group(1)))
    return found
