"""timm and mmpretrain ViT state dicts <-> ours; other keys reported unknown (docs/checkpoints.md#converting-files)."""
import math
import re
from typing import Dict, List, Optional, Sequence, Tuple

import torch

from ..checkpoint.key_maps import TIMM_KEY_RE, mmpretrain_to_ours_key, ours_to_mmpretrain_key, swiglu_blocks
from ..checkpoint.records import RECORD_KEYS
from .common import BACKBONE_PREFIX, HEAD_PREFIX, ConversionReport, strip_prefix

#: Backbone keys of ours that are not weights: the grid buffer and the records (see checkpoint.records).
_OURS_EXTRA = ('pos_embed_grid', *RECORD_KEYS)


def _split(state_dict: Dict[str, torch.Tensor], backbone_prefix: str) -> Tuple[Dict, Dict]:
    """(backbone-relative keys, other keys) of a whole-classifier or bare-backbone state dict."""
    state_dict = strip_prefix(state_dict, ('module.', ))
    if any(k.startswith(backbone_prefix) for k in state_dict):
        inner = {k[len(backbone_prefix):]: v for k, v in state_dict.items() if k.startswith(backbone_prefix)}
        rest = {k: v for k, v in state_dict.items() if not k.startswith(backbone_prefix)}
        return inner, rest
    return state_dict, {}


def _with_grid(out: Dict[str, torch.Tensor], prefix: str, pos_embed_grid: Optional[Sequence[int]]):
    if pos_embed_grid is not None:
        out[prefix + 'pos_embed_grid'] = torch.tensor(tuple(pos_embed_grid), dtype=torch.long)


def timm_to_vit(state_dict: Dict[str, torch.Tensor],
                backbone_prefix: str = BACKBONE_PREFIX,
                head_prefix: Optional[str] = HEAD_PREFIX,
                pos_embed_grid: Optional[Sequence[int]] = None,
                source: str = 'timm state dict') -> Tuple[Dict[str, torch.Tensor], ConversionReport]:
    """timm ``VisionTransformer`` state dict -> ours.

    Args:
        state_dict (dict): timm weights (a 'module.' prefix is removed).
        backbone_prefix (str): Prefix of our backbone keys. Defaults to 'backbone.'; '' for a bare one.
        head_prefix (str, optional): Where timm's ``head`` goes. Defaults to 'head.layers.'; None
            drops it (reported).
        pos_embed_grid (tuple[int, int], optional): Grid of a non-square position embedding.
        source (str): Name used in the report.

    Returns:
        tuple: (our state dict, :class:`ConversionReport`).
    """
    report = ConversionReport(source=source)
    out = {}
    for key, value in strip_prefix(state_dict, ('module.', )).items():
        if TIMM_KEY_RE.match(key):
            out[backbone_prefix + key] = value
            report.loaded.append(backbone_prefix + key)
        elif key in ('head.weight', 'head.bias'):
            if head_prefix is None:
                report.dropped.append(key)
            else:
                out[head_prefix + key] = value
                report.loaded.append(head_prefix + key)
        else:
            report.unknown.append(key)
    _with_grid(out, backbone_prefix, pos_embed_grid)
    return out, report


def vit_to_timm(state_dict: Dict[str, torch.Tensor],
                backbone_prefix: str = BACKBONE_PREFIX,
                head_prefix: str = HEAD_PREFIX,
                source: str = 'vit_plugin state dict') -> Tuple[Dict[str, torch.Tensor], ConversionReport]:
    """Our state dict -> timm ``VisionTransformer`` keys; ``pre_logits`` and ``fc_norm`` are reported unknown."""
    report = ConversionReport(source=source)
    inner, rest = _split(state_dict, backbone_prefix)
    out = {}
    for key, value in inner.items():
        if TIMM_KEY_RE.match(key):
            out[key] = value
            report.loaded.append(key)
        elif key in _OURS_EXTRA:
            report.dropped.append(backbone_prefix + key)
        else:
            report.unknown.append(backbone_prefix + key)
    for key, value in rest.items():
        if key in (head_prefix + 'head.weight', head_prefix + 'head.bias'):
            out[key[len(head_prefix):]] = value
            report.loaded.append(key[len(head_prefix):])
        else:
            report.unknown.append(key)
    return out, report


def mmpretrain_to_vit(state_dict: Dict[str, torch.Tensor],
                      backbone_prefix: str = BACKBONE_PREFIX,
                      head_prefix: Optional[str] = HEAD_PREFIX,
                      pos_embed_grid: Optional[Sequence[int]] = None,
                      source: str = 'mmpretrain state dict') -> Tuple[Dict[str, torch.Tensor], ConversionReport]:
    """mmpretrain ``VisionTransformer`` (bare or in an ``ImageClassifier``) -> ours; the head keeps its keys."""
    report = ConversionReport(source=source)
    inner, rest = _split(state_dict, 'backbone.')
    out = {}
    for key, value in inner.items():
        new = mmpretrain_to_ours_key(key)
        if new is not None:
            out[backbone_prefix + new] = value
            report.loaded.append(backbone_prefix + new)
        else:
            report.unknown.append(key if not rest else 'backbone.' + key)
    for key, value in rest.items():
        if key.startswith(HEAD_PREFIX) and key[len(HEAD_PREFIX):] in (
                'head.weight', 'head.bias', 'pre_logits.weight', 'pre_logits.bias'):
            if head_prefix is None:
                report.dropped.append(key)
            else:
                out[head_prefix + key[len(HEAD_PREFIX):]] = value
                report.loaded.append(head_prefix + key[len(HEAD_PREFIX):])
        else:
            report.unknown.append(key)
    _with_grid(out, backbone_prefix, pos_embed_grid)
    return out, report


#: Parts of an mmpretrain masked-image-modelling training checkpoint (``MAE``, ``MaskFeat``) that are
#: not the encoder: the decoder or projection (``neck``), the loss (``head``), the target (``HOG``
#: buffers of ``target_generator``) and the normalisation of the inputs.
MIM_PRETRAIN_PARTS = ('neck.', 'head.', 'target_generator.', 'data_preprocessor.')


def mmpretrain_mim_to_vit(state_dict: Dict[str, torch.Tensor],
                          backbone_prefix: str = BACKBONE_PREFIX,
                          pos_embed_grid: Optional[Sequence[int]] = None,
                          source: str = 'mmpretrain MIM state dict'
                          ) -> Tuple[Dict[str, torch.Tensor], ConversionReport]:
    """The encoder of mmpretrain's MAE or MaskFeat -> our backbone; pre-training parts are dropped.

    Args:
        state_dict (dict): A whole self-supervised model or a bare encoder ('module.' removed).
        backbone_prefix (str): Prefix of our backbone keys. Defaults to 'backbone.'.
        pos_embed_grid (tuple[int, int], optional): Grid of a non-square table.
        source (str): Name used in the report.

    Returns:
        tuple: (our backbone state dict, :class:`ConversionReport`).
    """
    inner, rest = _split(state_dict, 'backbone.')
    outer = 'backbone.' if any(k.startswith('backbone.') for k in strip_prefix(state_dict, ('module.', ))) else ''
    dropped = [outer + 'mask_token'] if 'mask_token' in inner else []
    encoder = {k: v for k, v in inner.items() if k != 'mask_token'}
    others = {k: v for k, v in rest.items() if not k.startswith(MIM_PRETRAIN_PARTS)}
    dropped += sorted(k for k in rest if k.startswith(MIM_PRETRAIN_PARTS))
    pos = encoder.get('pos_embed')
    if pos_embed_grid is None and pos is not None:
        side = math.isqrt(pos.shape[1] - int('cls_token' in encoder))
        if side * side == pos.shape[1] - int('cls_token' in encoder):
            pos_embed_grid = (side, side)
    out, report = mmpretrain_to_vit({**{'backbone.' + k: v for k, v in encoder.items()}, **others},
                                    backbone_prefix=backbone_prefix, head_prefix=None,
                                    pos_embed_grid=pos_embed_grid, source=source)
    report.dropped += dropped
    if pos is not None and any(k.startswith('neck.decoder_') for k in rest):
        report.notes.append(f"{backbone_prefix}pos_embed: MAE's fixed 2D sin-cos table, now learnable (initialised "
                            f"to it; fine-tuning trains it)")
    elif pos is not None:
        report.notes.append(f'{backbone_prefix}pos_embed: loaded into our learnable table (if the source kept it '
                            f'fixed, as MAE does, fine-tuning now trains it)')
    return out, report


def vit_to_mmpretrain(state_dict: Dict[str, torch.Tensor],
                      backbone_prefix: str = BACKBONE_PREFIX,
                      source: str = 'vit_plugin state dict') -> Tuple[Dict[str, torch.Tensor], ConversionReport]:
    """Our state dict -> mmpretrain ``VisionTransformer`` keys; the inverse of :func:`mmpretrain_to_vit`."""
    report = ConversionReport(source=source)
    inner, rest = _split(state_dict, backbone_prefix)
    swiglu = swiglu_blocks(inner)
    outer = 'backbone.' if rest or (backbone_prefix and any(k.startswith(backbone_prefix) for k in state_dict)) else ''
    out = {}
    for key, value in inner.items():
        if key in _OURS_EXTRA:
            report.dropped.append(backbone_prefix + key)
            continue
        block = re.match(r'blocks\.(\d+)\.', key)
        new = ours_to_mmpretrain_key(key, swiglu=block is not None and int(block.group(1)) in swiglu)
        if new is None:
            report.unknown.append(key)
            continue
        out[outer + new] = value
        report.loaded.append(outer + new)
    for key, value in rest.items():
        if key.startswith(HEAD_PREFIX):
            out[key] = value
            report.loaded.append(key)
        else:
            report.unknown.append(key)
    return out, report


def detect_torch_format(state_dict: Dict[str, torch.Tensor]) -> str:
    """'vit_plugin', 'timm', 'mmpretrain' or 'mmpretrain_mim' from the key names; ValueError if none fits."""
    keys: List[str] = [k[len('module.'):] if k.startswith('module.') else k for k in state_dict]
    bare = [k[len('backbone.'):] if k.startswith('backbone.') else k for k in keys]
    if any(re.match(r'layers\.\d+\.ln1\.', k) for k in bare) or 'patch_embed.projection.weight' in bare:
        # A masked-image-modelling model (MAE, MaskFeat): a mask token, a decoder or HOG buffers
        # around the encoder, and no weights in its head (a classifier's head has some).
        pretraining = 'mask_token' in bare or any(k.startswith(('neck.', 'target_generator.')) for k in keys)
        if pretraining and not any(k.startswith('head.') for k in keys):
            return 'mmpretrain_mim'
        return 'mmpretrain'
    if any(k.startswith('head.layers.') for k in keys) or 'pos_embed_grid' in bare:
        return 'vit_plugin'
    if any(re.match(r'blocks\.\d+\.attn\.qkv\.', k) for k in keys):
        return 'timm'
    raise ValueError(f'cannot tell the layout of a state dict with keys like {keys[:4]}; pass --src-format')
