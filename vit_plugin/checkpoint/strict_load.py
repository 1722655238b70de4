"""Strict loading for inference and export: every weight fits the config's model, or a clear error.

See docs/inference.md#run-a-trained-model-on-images-toolsinferpy."""
from typing import Dict, List, Optional, Tuple

import torch
import torch.nn as nn

from vit_plugin.label_spaces import spaces_of_size

from .adapting import AdaptsIncomingWeights

#: Prefix of the backbone's weights in mmpretrain / mmdet models.
BACKBONE_PREFIX = 'backbone.'


class CheckpointMismatchError(ValueError):
    """A checkpoint whose weights do not fit the model built from the config."""


def state_dict_of(checkpoint, filename: str) -> Dict[str, torch.Tensor]:
    """The tensors of a loaded checkpoint (``state_dict``, ``model``, ``module`` or itself), DDP prefix removed;
    CheckpointMismatchError if none."""
    if isinstance(checkpoint, dict):
        for key in ('state_dict', 'model', 'module'):
            if isinstance(checkpoint.get(key), dict):
                checkpoint = checkpoint[key]
                break
    if not isinstance(checkpoint, dict) or not checkpoint or not all(
            isinstance(v, torch.Tensor) for v in checkpoint.values()):
        raise CheckpointMismatchError(
            f'{filename} holds no state dict of tensors (looked at the file itself and its "state_dict"/"model" '
            f'entries); pass a checkpoint saved by mmengine or torch.save')
    return {k[7:] if k.startswith('module.') else k: v for k, v in checkpoint.items()}


def _shape(t) -> Tuple[int, ...]:
    return tuple(t.shape)


def _label_space_hint(key: str, theirs: Tuple[int, ...], ours: Tuple[int, ...]) -> Optional[str]:
    """What to set when a ViT classifier's rows are another label space's classes."""
    if not key.endswith(('layers.head.weight', 'layers.head.bias')) or theirs[1:] != ours[1:]:
        return None
    src, dst = spaces_of_size(theirs[0]), spaces_of_size(ours[0])
    if not src or not dst:
        return None
    return (f"{key} has {theirs[0]} rows in the checkpoint and {ours[0]} in the model; if these are label spaces "
            f"{src[0]} and {dst[0]}, set head=dict(type='vit_plugin.LabelSpaceClsHead', label_space={dst[0]!r}, "
            f"checkpoint_label_space={src[0]!r}) (docs/checkpoints.md#label-spaces)")


def fit_state_dict(model: nn.Module, state: Dict[str, torch.Tensor], source: str, backbone_only: bool = False,
                   option: str = '--backbone-only') -> Dict[str, torch.Tensor]:
    """What of ``state`` to load into ``model``: bare backbones prefixed, adapters run, ``backbone_only`` kept.

    Raises CheckpointMismatchError naming the weights, both shapes and ``option``."""
    model_state = model.state_dict()
    if not any(k.startswith(BACKBONE_PREFIX) for k in state) and \
            any(BACKBONE_PREFIX + k in model_state for k in state):
        state = {BACKBONE_PREFIX + k: v for k, v in state.items()}
    backbone = {k: v for k, v in state.items() if k.startswith(BACKBONE_PREFIX)}
    if not backbone and any(k.startswith(BACKBONE_PREFIX) for k in model_state):
        raise CheckpointMismatchError(f'{source} holds no backbone weights (no key starts with "backbone." or '
                                      f'matches the backbone\'s names); it is not a checkpoint of this model.')
    if backbone_only:
        return backbone
    state = dict(state)
    for name, module in model.named_modules():  # e.g. a head that reorders another label space's rows
        if isinstance(module, AdaptsIncomingWeights):
            try:
                module.adapt_incoming_weights(state, f'{name}.' if name else '')
            except ValueError as err:
                raise CheckpointMismatchError(f'{source}: {err}') from None
    problems: List[str] = []
    hints: List[str] = []
    for key, value in model_state.items():
        if key.startswith(BACKBONE_PREFIX) or key.startswith('data_preprocessor.'):
            continue
        if key not in state:
            problems.append(f'{key} {_shape(value)} is not in the checkpoint')
        elif _shape(state[key]) != _shape(value):
            problems.append(f'{key} has shape {_shape(state[key])} in the checkpoint and {_shape(value)} in the '
                            f'model')
            hints += [h for h in [_label_space_hint(key, _shape(state[key]), _shape(value))] if h]
    extra = [k for k in state if not k.startswith(BACKBONE_PREFIX) and k not in model_state]
    problems += [f'{k} {_shape(state[k])} is in the checkpoint but not in the model' for k in extra]
    if problems:
        shown = '; '.join(problems[:4]) + (f'; and {len(problems) - 4} more' if len(problems) > 4 else '')
        if hints:
            raise CheckpointMismatchError(f'{source}: {hints[0]}')
        raise CheckpointMismatchError(
            f'{source} does not fit the model built from the config outside its backbone: {shown}. Use the config '
            f'the checkpoint was trained with, or pass {option} to load only the backbone on purpose (the rest keeps '
            f'the config\'s initialisation).')
    return state


def load_state_dict_strict(model: nn.Module, state: Dict[str, torch.Tensor], source: str,
                           backbone_only: bool = False) -> None:
    """Load ``state`` through the modules' hooks; CheckpointMismatchError unless every weight loads with its shape."""
    try:
        result = model.load_state_dict(state, strict=False)
    except (RuntimeError, ValueError) as err:  # size mismatches the loading hooks refuse or do not adapt
        raise CheckpointMismatchError(f'{source} does not fit the model built from the config: {err}') from None
    missing = [k for k in result.missing_keys if not backbone_only or k.startswith(BACKBONE_PREFIX)]
    missing = [k for k in missing if not k.startswith('data_preprocessor.')]
    unexpected = list(result.unexpected_keys)
    if missing or unexpected:
        details = []
        if missing:
            details.append(f'{len(missing)} weights of the model are not in it (e.g. {", ".join(missing[:3])})')
        if unexpected:
            details.append(f'{len(unexpected)} of its weights are not in the model (e.g. {", ".join(unexpected[:3])})')
        raise CheckpointMismatchError(f'{source} does not fit the model built from the config: '
                                      f'{" and ".join(details)}. Use the config the checkpoint was trained with.')


def load_checkpoint_strict(model: nn.Module, filename: str, backbone_only: bool = False,
                           option: str = '--backbone-only', map_location='cpu') -> dict:
    """Load ``filename`` safely into ``model`` and return the checkpoint (its ``meta``: class names ...).

    ``backbone_only`` loads the backbone only, on purpose (``option``: its spelling in messages).
    Raises CheckpointMismatchError (:func:`fit_state_dict`, :func:`load_state_dict_strict`)."""
    from mmengine.runner.checkpoint import CheckpointLoader
    checkpoint = CheckpointLoader.load_checkpoint(filename, map_location=map_location)
    state = fit_state_dict(model, state_dict_of(checkpoint, filename), filename, backbone_only, option)
    load_state_dict_strict(model, state, filename, backbone_only)
    return checkpoint if isinstance(checkpoint, dict) else {}


def checkpoint_classes(checkpoint: dict) -> Optional[dict]:
    """The dataset meta (class names) recorded in a checkpoint's meta, as mmpretrain / mmdet store it."""
    meta = checkpoint.get('meta') or {}
    if 'dataset_meta' in meta:
        return {k.lower(): v for k, v in meta['dataset_meta'].items()}
    if 'CLASSES' in meta:
        return {'classes': meta['CLASSES']}
    return None
