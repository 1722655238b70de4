"""Adapting an incoming state dict's shapes and key names to a ViT, on every loading path.

Tensors and names only, never the model (docs/checkpoints.md#every-loading-path)."""
import math
import re
from typing import Dict, List, Optional, Tuple

import torch
from mmengine.logging import print_log

from vit_plugin.checkpoint.key_maps import mmpretrain_to_ours_key
from vit_plugin.checkpoint.records import resize_mode_for
from .numerics import record_gelu, record_input_norm, record_norm_eps  # noqa: F401  (also named here)
from .patch_resize import resize_patch_embed
from .pos_embed import infer_grid, resize_pos_embed
from .rel_pos import REL_POS_PARAM_SUFFIXES, resize_rel_pos_table


def _num_blocks(state_dict: Dict[str, torch.Tensor], prefix: str) -> Optional[int]:
    pattern = re.compile(re.escape(prefix) + r'blocks\.(\d+)\.')
    found = {int(m.group(1)) for k in state_dict for m in [pattern.match(k)] if m}
    return max(found) + 1 if found else None


#: Where a whole model of ours or mmpretrain's keeps its backbone ('module.' when saved from a DDP
#: wrapper without mmengine, which strips it itself).
_BACKBONE_PARTS = ('backbone.', 'module.backbone.')
_PATCH_KERNELS = ('patch_embed.proj.weight', 'patch_embed.projection.weight')  # ours/timm, mmpretrain


def _take_backbone_part(model, state_dict, prefix) -> List[str]:
    """A bare backbone given a whole model's weights takes their one ``backbone.`` part, in place."""
    if prefix + 'pos_embed' in state_dict:
        return []
    suffix = '.pos_embed'
    parts = sorted({k[len(prefix):len(k) - len(suffix) + 1] for k in state_dict
                    if k.startswith(prefix) and k.endswith(suffix)})
    # a ViT has a patch embedding next to its position embedding (another module's table is not one)
    vits = [p for p in parts if any(prefix + p + name in state_dict for name in _PATCH_KERNELS)]
    parts = vits or parts
    if not parts:
        return []
    name = type(model).__name__
    if len(parts) > 1 or parts[0] not in _BACKBONE_PARTS:
        found = ', '.join(repr(p) for p in parts)
        why = ('so which one belongs to this backbone is ambiguous' if len(parts) > 1 else
               "not under 'backbone.', so it is not taken without being named")
        raise ValueError(
            f'{prefix}pos_embed: the checkpoint holds a whole model, not a bare {name} backbone; its ViT weights '
            f'sit under {found}, {why}. Name the part, e.g. init_cfg=dict(type=\'Pretrained\', checkpoint=..., '
            f'prefix={parts[0]!r}), or load the file into the whole model (load_from).')
    outer = prefix + parts[0]
    inner = {prefix + k[len(outer):]: v for k, v in state_dict.items() if k.startswith(outer)}
    others = [k for k in state_dict if k.startswith(prefix) and not k.startswith(outer)]
    for key in [k for k in state_dict if k.startswith(prefix)]:
        del state_dict[key]
    state_dict.update(inner)
    shown = ', '.join(others[:3]) + (', ...' if len(others) > 3 else '')
    return [f'The checkpoint holds a whole model: loading its "{parts[0]}" part ({len(inner)} tensors) into '
            f'the bare {name} backbone, as init_cfg prefix={parts[0]!r} would'
            + (f'; its {len(others)} other tensors ({shown}) are not the backbone\'s and were left out'
               if others else '')]


def _rename_mmpretrain_keys(state_dict, prefix) -> List[str]:
    """mmpretrain ``VisionTransformer`` names -> ours, in place."""
    if prefix + 'layers.0.ln1.weight' not in state_dict or prefix + 'blocks.0.norm1.weight' in state_dict:
        return []
    renamed = 0
    for key in [k for k in state_dict if k.startswith(prefix)]:
        new = mmpretrain_to_ours_key(key[len(prefix):])
        if new is not None and new != key[len(prefix):]:
            state_dict[prefix + new] = state_dict.pop(key)
            renamed += 1
    return [f'Renamed {renamed} mmpretrain VisionTransformer keys under "{prefix}" to vit_plugin names '
            f'(layers.i.ln1 -> blocks.i.norm1, ffn.layers.0.0 -> mlp.fc1, ...)']


def _check_width(model, table, key) -> None:
    """Refuse a position embedding of another width: the weights belong to another architecture."""
    if table.shape[-1] != model.embed_dims:
        raise ValueError(
            f'{key}: the checkpoint has width {table.shape[-1]} but the model has embed_dims={model.embed_dims}. '
            f'Build the backbone with the checkpoint\'s arch (tools/convert_checkpoint.py prints it), or pick the '
            f'checkpoint of this arch.')


def _check_depth(model, state_dict, prefix) -> None:
    """Refuse weights with another number of encoder blocks."""
    depth = _num_blocks(state_dict, prefix)
    if depth is not None and depth != model.num_layers:
        raise ValueError(
            f'{prefix}blocks.{depth - 1}: the checkpoint has {depth} encoder blocks but the model has '
            f'{model.num_layers}: it belongs to another architecture. Build the backbone with '
            f'num_layers={depth} (or the matching arch name), or pick the checkpoint of this arch.')


def _check_block_structure(model, state_dict, prefix) -> None:
    """Refuse weights whose blocks are built otherwise (layer scale, pre-norm, MLP type)."""
    if _num_blocks(state_dict, prefix) is None:
        return
    own = dict(model.named_parameters())
    parts = [(f'blocks.{i}.ls1.gamma', ('layer_scale_init_value=1e-5 (any value > 0: the checkpoint\'s scales '
                                        'load)', 'layer_scale_init_value=0')) for i in range(model.num_layers)]
    parts.append(('norm_pre.weight', ('pre_norm=True', 'pre_norm=False')))
    for name, (to_add, to_remove) in parts:
        if (prefix + name in state_dict) != (name in own):
            theirs = prefix + name in state_dict
            raise ValueError(f'{prefix}{name}: the checkpoint {"has" if theirs else "lacks"} this weight but the model '
                             f'{"lacks" if theirs else "has"} it: it was trained with another block structure. Build '
                             f'the backbone like the checkpoint: {to_add if theirs else to_remove}.')
    key = prefix + 'blocks.0.mlp.fc1.weight'
    theirs, ours = state_dict.get(key), own.get('blocks.0.mlp.fc1.weight')
    if theirs is not None and ours is not None and theirs.shape != ours.shape:
        raise ValueError(f'{key}: the checkpoint MLP has shape {tuple(theirs.shape)} but the model expects '
                         f'{tuple(ours.shape)}: another MLP width or type. A SwiGLU checkpoint (DINOv2-g) needs '
                         f"layer_cfgs=dict(ffn_type='swiglu_fused'); otherwise build the arch of the checkpoint.")


def _adapt_patch_kernel(model, state_dict, prefix) -> List[str]:
    """A patch-embedding kernel of another size is resized by the pseudo-inverse."""
    key = prefix + 'patch_embed.proj.weight'
    weight = state_dict.get(key)
    own = model.patch_embed.proj.weight
    if weight is None or weight.shape == own.shape:
        return []
    if weight.dim() != 4 or weight.shape[:2] != own.shape[:2]:
        raise ValueError(
            f'{key}: the checkpoint kernel has shape {tuple(weight.shape)} but the model expects '
            f'{tuple(own.shape)} (out, in, kh, kw); width and input channels must match: build the model '
            f'with the checkpoint\'s arch and in_channels, or pick the matching checkpoint.')
    state_dict[key] = resize_patch_embed(weight, own.shape[-2:])
    return [f'Resized patch-embedding kernel "{key}" from {weight.shape[-2]}x{weight.shape[-1]} to '
            f'{own.shape[-2]}x{own.shape[-1]} (FlexiViT pseudo-inverse, bilinear)']


def _adapt_rel_pos(model, state_dict, prefix) -> List[str]:
    """Relative position tables: resized to the model, zero when absent, refused for a model without."""
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
        raise ValueError(f'{key}: the checkpoint table has {num_prefix} class/extra-token entries before its patch '
                         f'grid but the model has {own}; build the model with with_cls_token=True, or, if the table '
                         f'is really a non-square grid, record its grid as pos_embed_grid=(rows, cols).')
    if num_prefix < own:
        raise ValueError(f'{key}: the checkpoint table has no class-token entry (a gap model) but the model has '
                         f"a class token; build the model with with_cls_token=False and out_type='gap', or, if the "
                         f'table is really a non-square grid, record its grid as pos_embed_grid=(rows, cols).')
    return num_prefix, grid


def _take_resize_mode(model, state_dict, prefix) -> Tuple[str, str]:
    """The position-embedding resize to apply, and where the choice came from (consumes the record)."""
    return resize_mode_for(state_dict, prefix, model.pos_embed_load_mode, consume=True,
                           fallback_name="the model's pos_embed_load_mode")


def _take_source_grid(model, state_dict, prefix) -> Optional[Tuple[int, ...]]:
    """Pop the incoming ``pos_embed_grid`` (None if absent) and store the model's own."""
    grid_key = prefix + 'pos_embed_grid'
    recorded = state_dict.get(grid_key)
    if recorded is not None or prefix + 'pos_embed' in state_dict:
        state_dict[grid_key] = model.pos_embed_grid.clone()
    return None if recorded is None else tuple(int(v) for v in torch.as_tensor(recorded).tolist())


def _pos_embed_table(state_dict, key) -> torch.Tensor:
    """The incoming position embedding as a (1, N, C) table."""
    table = state_dict[key]
    return table.unsqueeze(0) if table.dim() == 2 else table


def _resize_pos_embed(model, state_dict, key, table, old_grid, mode, mode_source) -> List[str]:
    """The position embedding on the model's patch grid, its class-token entries kept."""
    num_prefix, old_grid = _source_layout(model, table, old_grid, key)
    if old_grid == model.patch_grid:
        state_dict[key] = table
        return []
    state_dict[key] = resize_pos_embed(table, model.patch_grid, old_grid, num_prefix, mode=mode,
                                       compute_dtype=torch.float64)
    new = model.patch_grid
    return [f'Resized position embedding "{key}" from a {old_grid[0]}x{old_grid[1]} to a {new[0]}x{new[1]} patch '
            f'grid (mode={mode}, {mode_source}; {num_prefix} class-token entry kept). This is intentional: the '
            f'weights were trained at another resolution or patch size']


def adapt_vit_state_dict(model, state_dict: Dict[str, torch.Tensor], prefix: str = '') -> List[str]:
    """Adapt the ``prefix`` part of ``state_dict`` in place to ``model``: keys, patch kernel, position tables.

    Returns the messages logged, one per change.

    Raises:
        ValueError: Weights of another architecture, an ambiguous whole-model ``backbone.`` part, or a
            non-square table whose source grid cannot be inferred.
    """
    key = prefix + 'pos_embed'
    messages = _take_backbone_part(model, state_dict, prefix)
    messages += _rename_mmpretrain_keys(state_dict, prefix)
    mode, mode_source = _take_resize_mode(model, state_dict, prefix)
    old_grid = _take_source_grid(model, state_dict, prefix)
    if key in state_dict:
        table = _pos_embed_table(state_dict, key)
        _check_width(model, table, key)
        _check_depth(model, state_dict, prefix)
        _check_block_structure(model, state_dict, prefix)
        messages += _adapt_patch_kernel(model, state_dict, prefix)
        messages += _adapt_rel_pos(model, state_dict, prefix)
        messages += _resize_pos_embed(model, state_dict, key, table, old_grid, mode, mode_source)
    for message in messages:
        print_log(message + '.', logger='current')
    return messages
