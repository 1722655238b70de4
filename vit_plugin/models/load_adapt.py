"""Adapting an incoming state dict to a ViT's geometry, whatever path loads it.

:func:`adapt_vit_state_dict` is the one place that decides how a checkpoint trained at another
resolution or patch size enters a :class:`~vit_plugin.models.ViT` (or a subclass such as
``HybridViT``). It runs from the backbone's load-state-dict pre-hook (``init_cfg`` Pretrained,
``load_from``, ``--resume``, plain ``load_state_dict``) and from
:class:`~vit_plugin.engine.hooks.PosEmbedResizeHook` inside the runner's checkpoint dict. Whichever
runs first does the work and logs it; the second finds nothing left to change, so every resize is
logged exactly once.

What it does, for the keys under ``prefix``:

* ``pos_embed_resize_mode`` (written by our converters, e.g. ``'official'`` for the official JAX
  release) is consumed: it selects the interpolation and overrides the model's
  ``pos_embed_load_mode``, because the file knows how its weights were meant to be resized;
* ``pos_embed`` is resized to the model's patch grid. The source grid comes from the incoming
  ``pos_embed_grid`` (written by our models and converters), otherwise it is inferred (square
  tables only; a non-square table without metadata is an error asking for the grid);
* ``patch_embed.proj.weight`` with another kernel size is resized by the pseudo-inverse
  (:func:`~vit_plugin.models.patch_resize.resize_patch_embed`);
* relative position tables (``use_rel_pos``) of another length are resized linearly, absent ones
  start at zero (ViTDet's initialisation), and tables for a model without them are refused;
* mmpretrain ``VisionTransformer`` key names are renamed to ours;
* a checkpoint of another width, depth or input-channel count, or a whole-classifier checkpoint
  loaded into a bare backbone, is refused with a message naming the key and the fix -- otherwise a
  non-strict load (``init_cfg`` Pretrained) would silently leave the backbone random.
"""
import math
import re
from typing import Dict, List, Optional, Tuple

import torch
from mmengine.logging import print_log

from .patch_resize import resize_patch_embed
from .pos_embed import RESIZE_MODES, infer_grid, resize_pos_embed
from .rel_pos import REL_POS_PARAM_SUFFIXES, resize_rel_pos_table

#: State-dict key (relative to the backbone) through which a checkpoint records the position-embedding
#: resize mode its weights expect: a 0-dim integer tensor indexing :data:`RESIZE_MODES`. A tensor (not
#: a string) so that it survives every loader, key revision and ``weights_only`` load unchanged.
MODE_KEY = 'pos_embed_resize_mode'


def encode_resize_mode(mode: str) -> torch.Tensor:
    """The tensor stored under :data:`MODE_KEY` for ``mode``."""
    if mode not in RESIZE_MODES:
        raise ValueError(f'unknown position-embedding resize mode {mode!r}; choose one of {RESIZE_MODES}')
    return torch.tensor(RESIZE_MODES.index(mode), dtype=torch.long)


def decode_resize_mode(value: torch.Tensor, key: str = MODE_KEY) -> str:
    """Inverse of :func:`encode_resize_mode`; a clear error for anything else."""
    index = int(value) if torch.is_tensor(value) and value.numel() == 1 else -1
    if not 0 <= index < len(RESIZE_MODES):
        raise ValueError(f'{key}: expected a scalar index into {RESIZE_MODES}, got {value!r}; '
                         f'delete the key to use the model\'s pos_embed_load_mode')
    return RESIZE_MODES[index]


def _num_blocks(state_dict: Dict[str, torch.Tensor], prefix: str) -> Optional[int]:
    pattern = re.compile(re.escape(prefix) + r'blocks\.(\d+)\.')
    found = {int(m.group(1)) for k in state_dict for m in [pattern.match(k)] if m}
    return max(found) + 1 if found else None


def _check_whole_classifier(model, state_dict, prefix):
    if prefix + 'pos_embed' in state_dict:
        return
    for outer in ('backbone.', 'module.backbone.'):
        if prefix + outer + 'pos_embed' in state_dict:
            raise ValueError(
                f'{prefix}pos_embed: the checkpoint holds a whole classifier (its keys start with '
                f'{outer!r}), but it is being loaded into the bare {type(model).__name__} backbone, so no '
                f'weight would load. In the backbone\'s init_cfg add prefix=\'{outer}\', i.e. '
                f"init_cfg=dict(type='Pretrained', checkpoint=..., prefix='{outer}'), or load it into the "
                f'whole model (load_from).')


def _rename_mmpretrain_keys(state_dict, prefix) -> Optional[str]:
    """mmpretrain ``VisionTransformer`` names (``layers.0.ln1`` ...) -> ours, in place: users point
    ``init_cfg`` at mmpretrain model-zoo checkpoints, and a non-strict load would skip every weight."""
    if prefix + 'layers.0.ln1.weight' not in state_dict or prefix + 'blocks.0.norm1.weight' in state_dict:
        return None
    from vit_plugin.converters.torch_formats import rename_mmpretrain_key  # converters import models
    renamed = 0
    for key in [k for k in state_dict if k.startswith(prefix)]:
        new = rename_mmpretrain_key(key[len(prefix):])
        if new is not None and new != key[len(prefix):]:
            state_dict[prefix + new] = state_dict.pop(key)
            renamed += 1
    return (f'Renamed {renamed} mmpretrain VisionTransformer keys under "{prefix}" to vit_plugin names '
            f'(layers.i.ln1 -> blocks.i.norm1, ffn.layers.0.0 -> mlp.fc1, ...)')


def _check_compatible(model, state_dict, prefix, table):
    key = prefix + 'pos_embed'
    if table.shape[-1] != model.embed_dims:
        raise ValueError(
            f'{key}: the checkpoint has width {table.shape[-1]} but the model has embed_dims='
            f'{model.embed_dims}: it belongs to another architecture. Build the backbone with the arch '
            f'the checkpoint was trained with (tools/convert_checkpoint.py prints it), or pick the '
            f'checkpoint of this arch.')
    depth = _num_blocks(state_dict, prefix)
    if depth is not None and depth != model.num_layers:
        raise ValueError(
            f'{prefix}blocks.{depth - 1}: the checkpoint has {depth} encoder blocks but the model has '
            f'{model.num_layers}: it belongs to another architecture. Build the backbone with '
            f'num_layers={depth} (or the matching arch name), or pick the checkpoint of this arch.')


def _adapt_patch_kernel(model, state_dict, prefix) -> Optional[str]:
    key = prefix + 'patch_embed.proj.weight'
    weight = state_dict.get(key)
    own = model.patch_embed.proj.weight
    if weight is None or weight.shape == own.shape:
        return None
    if weight.dim() != 4 or weight.shape[:2] != own.shape[:2]:
        raise ValueError(
            f'{key}: the checkpoint kernel has shape {tuple(weight.shape)} but the model expects '
            f'{tuple(own.shape)} (out, in, kh, kw); width and input channels must match: build the model '
            f'with the checkpoint\'s arch and in_channels, or pick the matching checkpoint.')
    state_dict[key] = resize_patch_embed(weight, own.shape[-2:])
    return (f'Resized patch-embedding kernel "{key}" from {weight.shape[-2]}x{weight.shape[-1]} to '
            f'{own.shape[-2]}x{own.shape[-1]} (FlexiViT pseudo-inverse, bilinear)')


def _adapt_rel_pos(model, state_dict, prefix) -> List[str]:
    """Relative position tables: resized to the model's lengths, or started at zero when absent.

    A checkpoint without them (the paper's weights, any classification run) is how ViTDet starts:
    its tables are zero-initialised, so the model computes what the checkpoint did. Tables in the
    checkpoint for a model without them would be dropped by a non-strict load, so that is an error.
    """
    own = {name: param for name, param in model.named_parameters() if name.endswith(REL_POS_PARAM_SUFFIXES)}
    incoming = [k for k in state_dict if k.startswith(prefix) and k.endswith(REL_POS_PARAM_SUFFIXES)]
    if incoming and not own:
        raise ValueError(f'{incoming[0]}: the checkpoint has relative position tables (ViTDet-style attention) '
                         f'but the model has none, so they would not load; build the backbone with '
                         f'use_rel_pos=True.')
    messages, started, resized = [], [], []
    for name, param in own.items():
        key = prefix + name
        table = state_dict.get(key)
        if table is None:
            state_dict[key] = torch.zeros_like(param)
            started.append(name)
        elif table.shape != param.shape:
            if table.dim() != 2 or table.shape[1] != param.shape[1]:
                raise ValueError(f'{key}: the checkpoint table has shape {tuple(table.shape)} but the model expects '
                                 f'(length, head_dims={param.shape[1]}); the head width differs, so the checkpoint '
                                 f'belongs to another architecture.')
            state_dict[key] = resize_rel_pos_table(table, param.shape[0])
            resized.append(f'{name} {table.shape[0]}->{param.shape[0]}')
    if started:
        messages.append(f'{len(started)} relative position tables are not in the checkpoint under "{prefix}" '
                        f'and start at zero, as in ViTDet (so the model first computes what the checkpoint did)')
    if resized:
        messages.append(f'Resized relative position tables linearly to this model\'s window/grid: '
                        f'{", ".join(resized)}')
    return messages


def _source_layout(model, table, old_grid, key) -> Tuple[int, Tuple[int, int]]:
    """Number of class-token entries and the patch grid of an incoming table (checked against the model)."""
    n, own = table.shape[1], model.num_prefix_tokens
    if old_grid is not None:
        if len(old_grid) != 2 or old_grid[0] * old_grid[1] > n:
            raise ValueError(f'{key}: the checkpoint\'s pos_embed_grid {old_grid} does not fit a table of {n} '
                             f'entries; delete the pos_embed_grid key so that a square grid is inferred, or '
                             f'set it to the (rows, cols) the weights were trained with.')
        num_prefix, grid = n - old_grid[0] * old_grid[1], old_grid
    elif n == model.pos_embed.shape[1]:
        num_prefix, grid = own, model.patch_grid  # same count: the model's own layout
    else:
        side = math.isqrt(max(n - own, 0))
        if side and side * side == n - own:
            num_prefix, grid = own, (side, side)
        else:
            other = 1 - min(own, 1)
            side = math.isqrt(max(n - other, 0))
            if not (side and side * side == n - other):
                infer_grid(n - own, None, key)  # raises: cannot infer, asks for the grid
            num_prefix, grid = other, (side, side)
    if num_prefix > own:
        raise ValueError(f'{key}: the checkpoint table has {num_prefix} class/extra-token entries before its '
                         f'patch grid but the model has {own}; build the model with '
                         f'with_cls_token=True, or, if the table is really a non-square grid, record its grid '
                         f'as pos_embed_grid=(rows, cols) in the state dict.')
    if num_prefix < own:
        raise ValueError(f'{key}: the checkpoint table has no class-token entry (a gap model) but the model has '
                         f"a class token; build the model with with_cls_token=False and out_type='gap', or, if the "
                         f'table is really a non-square grid, record its grid as pos_embed_grid=(rows, cols).')
    return num_prefix, grid


def adapt_vit_state_dict(model, state_dict: Dict[str, torch.Tensor], prefix: str = '') -> List[str]:
    """Adapt ``state_dict`` in place so that its ``prefix`` part loads into ``model``.

    Args:
        model (ViT): The receiving backbone (needs ``pos_embed``, ``pos_embed_grid``, ``patch_grid``,
            ``num_prefix_tokens``, ``pos_embed_load_mode``, ``embed_dims``, ``num_layers``,
            ``patch_embed.proj``).
        state_dict (dict): Incoming weights; modified in place.
        prefix (str): Key prefix of the backbone inside ``state_dict`` (e.g. 'backbone.'). Defaults
            to ''.

    Returns:
        list[str]: One message per change made (already logged).

    Raises:
        ValueError: the weights belong to another architecture, a whole classifier is loaded into a
            bare backbone, or the source grid of a non-square table cannot be inferred.
    """
    key, grid_key, mode_key = prefix + 'pos_embed', prefix + 'pos_embed_grid', prefix + MODE_KEY
    messages = []
    _check_whole_classifier(model, state_dict, prefix)
    message = _rename_mmpretrain_keys(state_dict, prefix)
    if message:
        messages.append(message)
    mode = model.pos_embed_load_mode
    mode_source = 'the model\'s pos_embed_load_mode'
    if mode_key in state_dict:
        mode = decode_resize_mode(state_dict.pop(mode_key), mode_key)
        mode_source = 'recorded in the checkpoint'
    old_grid = state_dict.get(grid_key)
    if old_grid is not None:
        old_grid = tuple(int(v) for v in torch.as_tensor(old_grid).tolist())
    if key not in state_dict:
        if old_grid is not None:
            state_dict[grid_key] = model.pos_embed_grid.clone()
        for message in messages:
            print_log(message + '.', logger='current')
        return messages
    state_dict[grid_key] = model.pos_embed_grid.clone()  # third-party weights carry no grid

    table = state_dict[key]
    if table.dim() == 2:
        table = table.unsqueeze(0)
    _check_compatible(model, state_dict, prefix, table)
    message = _adapt_patch_kernel(model, state_dict, prefix)
    if message:
        messages.append(message)
    messages.extend(_adapt_rel_pos(model, state_dict, prefix))
    num_prefix, old_grid = _source_layout(model, table, old_grid, key)
    if old_grid == model.patch_grid:
        state_dict[key] = table
    else:
        state_dict[key] = resize_pos_embed(table, model.patch_grid, old_grid, num_prefix, mode=mode,
                                           compute_dtype=torch.float64)
        new = model.patch_grid
        messages.append(f'Resized position embedding "{key}" from a {old_grid[0]}x{old_grid[1]} to a '
                        f'{new[0]}x{new[1]} patch grid (mode={mode}, {mode_source}; {num_prefix} class-token '
                        f'entry kept). This is intentional: the weights were trained at another resolution '
                        f'or patch size')
    for message in messages:
        print_log(message + '.', logger='current')
    return messages
