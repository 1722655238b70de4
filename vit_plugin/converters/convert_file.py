"""Whole-file conversion behind ``tools/convert_checkpoint.py``: read, convert, check, write atomically."""
import os
import os.path as osp
import tempfile
from dataclasses import dataclass
from typing import Any, Dict, Optional, Sequence, Tuple

import torch

from ..checkpoint import read_checkpoint_file, sniff_checkpoint, write_safetensors
from ..checkpoint.formats import folder_weights
from ..checkpoint.hub import HUB_PREFIX, resolve_hub_checkpoint
from ..checkpoint.records import MODE_KEY, encode_resize_mode, resize_mode_for
from ..models.backbones.vit_arch import VIT_ARCHS
from ..models.layers import swiglu_hidden_dims
from ..models.patch_resize import resize_patch_embed
from ..models.pos_embed import CHECKPOINT_RESIZE_MODE, infer_grid, resize_pos_embed, to_2tuple
from .common import (BACKBONE_PREFIX, PROGRESS_MIN_BYTES, ConversionError, ConversionReport, strip_prefix,
                     unwrap_state_dict)
from .jax_npz import convert_jax_vit, read_npz
from .torch_formats import (detect_torch_format, mmpretrain_mim_to_vit, mmpretrain_to_vit, timm_to_vit,
                            vit_to_mmpretrain, vit_to_timm)
from .finetune_head import finetune_transfer
from .head_label_space import convert_head_label_space
from .transformers_vit import is_transformers_vit, read_transformers_config, transformers_to_vit, vit_to_transformers

SRC_FORMATS = ('auto', 'jax', 'timm', 'mmpretrain', 'mmpretrain_mim', 'vit_plugin', 'transformers')
DST_FORMATS = ('vit_plugin', 'timm', 'mmpretrain', 'transformers')

#: Output files ending in this are written as safetensors (no pickle), with ``meta`` as JSON metadata.
SAFETENSORS_SUFFIX = '.safetensors'


def _torch_arch(state_dict: Dict[str, torch.Tensor], bp: str) -> Dict[str, Any]:
    """Width, depth, MLP width (SwiGLU: ``swiglu_hidden_dims``) and patch size from our shapes."""
    depth = 0
    while f'{bp}blocks.{depth}.norm1.weight' in state_dict:
        depth += 1
    pos = state_dict.get(bp + 'pos_embed')
    fc1 = state_dict.get(bp + 'blocks.0.mlp.fc1.weight')
    fc2 = state_dict.get(bp + 'blocks.0.mlp.fc2.weight')
    kernel = state_dict.get(bp + 'patch_embed.proj.weight')
    swiglu = fc1 is not None and fc2 is not None and fc1.shape[0] == 2 * fc2.shape[1]
    return dict(embed_dims=None if pos is None else pos.shape[-1], num_layers=depth,
                mlp_dims=None if fc1 is None or swiglu else fc1.shape[0],
                swiglu_hidden_dims=fc2.shape[1] if swiglu else None,
                patch_size=None if kernel is None else tuple(kernel.shape[-2:]),
                keys=dict(embed_dims=bp + 'pos_embed', num_layers=bp + 'blocks.*',
                          mlp_dims=bp + 'blocks.0.mlp.fc1.weight', swiglu_hidden_dims=bp + 'blocks.0.mlp.fc2.weight'))


def check_arch(arch: str, found: Dict[str, Any], source: str) -> None:
    """Raise if the converted weights are not of the ``arch`` the user expects (e.g. 'b', 'large')."""
    expected = VIT_ARCHS.get(arch.lower())
    if expected is None:
        raise ConversionError(f'--arch {arch!r} is not one of {sorted(set(VIT_ARCHS))}')
    expected = dict(expected, swiglu_hidden_dims=swiglu_hidden_dims(expected['mlp_dims']))
    for name in ('embed_dims', 'num_layers', 'num_heads', 'mlp_dims', 'swiglu_hidden_dims'):
        if found.get(name) is not None and found[name] != expected[name]:
            key = found.get('keys', {}).get(name, '?')
            raise ConversionError(
                f'{source} is not a ViT-{arch}: it has {name}={found[name]} (from {key!r}) where ViT-{arch} '
                f'has {expected[name]}. It is the file of another model: pick the ViT-{arch} file, or drop '
                f'--arch to convert this one as what it is.')


def _resize_to(state_dict, bp: str, img_size, patch_size, reduction: int, report: ConversionReport,
               mode: Optional[str]) -> None:
    key = bp + 'pos_embed'
    table, grid_t = state_dict[key], state_dict.get(bp + 'pos_embed_grid')
    img_size = to_2tuple(img_size)
    new = (img_size[0] // (patch_size[0] * reduction), img_size[1] // (patch_size[1] * reduction))
    with_cls = bp + 'cls_token' in state_dict
    old = infer_grid(table.shape[1] - int(with_cls), None if grid_t is None else grid_t.tolist(), key)
    mode, _ = resize_mode_for(state_dict, bp, CHECKPOINT_RESIZE_MODE, override=mode)
    if old != new:
        state_dict[key] = resize_pos_embed(table, new, old, int(with_cls), mode=mode, compute_dtype=torch.float64)
        report.resized.append(f'{key}: {old[0]}x{old[1]} -> {new[0]}x{new[1]} patch grid (mode={mode})')
    state_dict[bp + 'pos_embed_grid'] = torch.tensor(new, dtype=torch.long)


@dataclass
class _Source:
    """A source file read and converted to our layout, before any option is applied."""
    state_dict: Dict[str, torch.Tensor]
    report: ConversionReport
    found: Dict[str, Any]  # the arch read from the file (see check_arch)
    meta: Dict[str, Any]
    reduction: int = 1  # image pixels per feature-map pixel before the patches (hybrid: the ResNet's)


def _read_jax(src: str, pos_embed_grid, show_progress: bool) -> _Source:
    arrays = read_npz(src)
    try:
        large = osp.getsize(src) >= PROGRESS_MIN_BYTES
        state_dict, report, info = convert_jax_vit(arrays, source=src, pos_embed_grid=pos_embed_grid,
                                                   show_progress=show_progress and large)
    finally:
        arrays.close()
    found = {k: info[k] for k in ('embed_dims', 'num_layers', 'num_heads', 'mlp_dims')}
    block = info['prefix'] + ('Transformer/encoderblock/' if info['scanned'] else 'Transformer/encoderblock_0/')
    found['keys'] = dict(embed_dims=info['prefix'] + 'embedding/kernel',
                         num_layers=info['prefix'] + 'Transformer/encoderblock*',
                         num_heads=block + 'MultiHeadDotProductAttention_*/query/kernel',
                         mlp_dims=block + 'MlpBlock_*/Dense_0/kernel')
    meta = dict(source=osp.basename(src), source_format='official-jax-npz', model_cfg=info['model_cfg'])
    return _Source(state_dict, report, found, meta, reduction=info['reduction'])


def _read_transformers(src: str, raw, config_file: Optional[str]) -> _Source:
    config = read_transformers_config(config_file) if config_file else None
    state_dict, report, info = transformers_to_vit(raw, config, source=src)
    if config is None:
        report.notes.append('no transformers config.json next to the weights: LayerNorm eps and GELU are unknown '
                            'and not recorded (transformers\' default: eps 1e-12, exact GELU)')
    found = _torch_arch(state_dict, BACKBONE_PREFIX)
    meta = dict(source=osp.basename(src), source_format='transformers')
    if info['model_cfg']:
        meta['model_cfg'] = info['model_cfg']
        found['num_heads'] = info['model_cfg']['arch']['num_heads']
    if info['classes']:
        meta['dataset_meta'] = dict(classes=info['classes'])
    return _Source(state_dict, report, found, meta)


def _read_torch(src: str, src_format: str, pos_embed_grid, config_file: Optional[str] = None) -> _Source:
    loaded = read_checkpoint_file(src)
    raw = unwrap_state_dict(loaded, source=src)
    stored_meta = loaded.get('meta') if isinstance(loaded.get('meta'), dict) else {}
    if src_format == 'torch':
        try:
            src_format = 'transformers' if is_transformers_vit(raw) else detect_torch_format(raw)
        except ValueError as err:
            raise ConversionError(f'{src}: {err}') from None
    if src_format == 'transformers':
        return _read_transformers(src, raw, config_file)
    if src_format == 'timm':
        state_dict, report = timm_to_vit(raw, pos_embed_grid=pos_embed_grid, source=src)
    elif src_format == 'mmpretrain':
        state_dict, report = mmpretrain_to_vit(raw, pos_embed_grid=pos_embed_grid, source=src)
    elif src_format == 'mmpretrain_mim':  # MAE / MaskFeat training checkpoint: the encoder only
        state_dict, report = mmpretrain_mim_to_vit(raw, pos_embed_grid=pos_embed_grid, source=src)
    else:  # ours: a whole classifier, or a bare backbone that gets the whole-classifier prefix
        raw = strip_prefix(raw, ('module.', ))
        if not any(k.startswith(BACKBONE_PREFIX) for k in raw):
            raw = {BACKBONE_PREFIX + k: v for k, v in raw.items()}
        state_dict, report = raw, ConversionReport(source=src, loaded=list(raw))
    meta = dict(source=osp.basename(src), source_format=src_format)
    meta.update({k: v for k, v in stored_meta.items() if k in ('model_cfg', 'dataset_meta', 'num_classes')})
    return _Source(state_dict, report, _torch_arch(state_dict, BACKBONE_PREFIX), meta)


def resolve_source(src: str) -> Tuple[str, Optional[str]]:
    """(weights file, config.json or None) of a file, a model folder or ``hf-hub:<org>/<name>[@rev]``."""
    if src.startswith(HUB_PREFIX):
        src = resolve_hub_checkpoint(src)
    if osp.isdir(src):
        return folder_weights(src)
    config = osp.join(osp.dirname(osp.abspath(src)), 'config.json')
    return src, config if osp.isfile(config) else None


def _change_patch_size(source: _Source, patch_size, img_size):
    """Resize the patch kernel; returns the image size the grid must then have."""
    state_dict, bp = source.state_dict, BACKBONE_PREFIX
    kernel_key = bp + 'patch_embed.proj.weight'
    if patch_size is None or kernel_key not in state_dict:
        return img_size
    old_kernel = state_dict[kernel_key]
    patch_size = to_2tuple(patch_size)
    if tuple(old_kernel.shape[-2:]) == patch_size:
        return img_size
    if img_size is None:  # keep the resolution, so the grid follows the new patch size
        grid = state_dict[bp + 'pos_embed_grid'].tolist() if bp + 'pos_embed_grid' in state_dict else \
            infer_grid(state_dict[bp + 'pos_embed'].shape[1] - int(bp + 'cls_token' in state_dict))
        img_size = tuple(g * k * source.reduction for g, k in zip(grid, old_kernel.shape[-2:]))
    state_dict[kernel_key] = resize_patch_embed(old_kernel, patch_size)
    source.report.resized.append(f'{kernel_key}: {old_kernel.shape[-2]}x{old_kernel.shape[-1]} -> '
                                 f'{patch_size[0]}x{patch_size[1]} kernel (FlexiViT pseudo-inverse)')
    if 'model_cfg' in source.meta:
        source.meta['model_cfg']['patch_size'] = patch_size
    return img_size


def _backbone_only(state_dict: Dict[str, torch.Tensor], report: ConversionReport) -> Dict[str, torch.Tensor]:
    """Bare backbone keys; everything else (the head) is dropped and reported."""
    out = {}
    for key, value in state_dict.items():
        if key.startswith(BACKBONE_PREFIX):
            out[key[len(BACKBONE_PREFIX):]] = value
        else:
            report.dropped.append(key)
    return out


def _num_heads(source: _Source, arch: Optional[str], num_heads: Optional[int]) -> int:
    """Attention heads for a transformers config: given, from --arch, or from the source's config."""
    if num_heads is not None:
        return int(num_heads)
    if arch:
        return int(VIT_ARCHS[arch.lower()]['num_heads'])
    cfg_arch = source.meta.get('model_cfg', {}).get('arch')
    if isinstance(cfg_arch, dict) and 'num_heads' in cfg_arch:
        return int(cfg_arch['num_heads'])
    if isinstance(cfg_arch, str) and cfg_arch.lower() in VIT_ARCHS:
        return int(VIT_ARCHS[cfg_arch.lower()]['num_heads'])
    raise ConversionError(f'{source.report.source}: transformers\' config.json needs the number of attention heads, '
                          f'which the weights do not say; pass --arch (e.g. b) or --num-heads.')


def write_transformers_folder(state_dict: Dict[str, torch.Tensor], config: Dict[str, Any], dst: str) -> None:
    """``model.safetensors`` and ``config.json`` into the folder ``dst``, each written atomically."""
    import json
    os.makedirs(dst, exist_ok=True)
    write_safetensors(state_dict, osp.join(dst, 'model.safetensors'))
    fd, tmp = tempfile.mkstemp(prefix='.config.json.', suffix='.partial', dir=dst)
    try:
        with os.fdopen(fd, 'w') as f:
            json.dump(config, f, indent=2)
        os.replace(tmp, osp.join(dst, 'config.json'))
    except BaseException:
        if osp.exists(tmp):
            os.remove(tmp)
        raise


def _export(state_dict: Dict[str, torch.Tensor], dst_format: str, bp: str, src: str,
            report: ConversionReport) -> Dict[str, torch.Tensor]:
    """Our layout -> ``dst_format``'s, refusing a conversion that would lose weights."""
    if dst_format == 'timm':
        state_dict, export = vit_to_timm(state_dict, backbone_prefix=bp, source=src)
        export.check(hint='timm\'s VisionTransformer has no pre_logits layer: convert with --num-classes, '
                          'or --backbone-only.')
    elif dst_format == 'mmpretrain':
        state_dict, export = vit_to_mmpretrain(state_dict, backbone_prefix=bp, source=src)
        export.check()
    else:
        return state_dict
    report.dropped += export.dropped
    return state_dict


def convert_checkpoint_file(src: str,
                            dst: str,
                            src_format: str = 'auto',
                            dst_format: str = 'vit_plugin',
                            arch: Optional[str] = None,
                            backbone_only: bool = False,
                            num_classes: Optional[int] = None,
                            keep_pre_logits: bool = False,
                            img_size: Optional[Sequence[int]] = None,
                            patch_size: Optional[Sequence[int]] = None,
                            pos_embed_grid: Optional[Sequence[int]] = None,
                            pos_embed_mode: Optional[str] = None,
                            allow_unknown: bool = False,
                            allow_missing: bool = False,
                            show_progress: bool = True,
                            num_heads: Optional[int] = None,
                            head_label_space: Optional[Tuple[str, str]] = None
                            ) -> Tuple[ConversionReport, Dict[str, Any]]:
    """Convert ``src`` (file, folder or ``hf-hub:`` id) to ``dst``: read, convert, check, write atomically.

    Options are ``tools/convert_checkpoint.py``'s (docs/checkpoints.md#converting-files). Returns
    (:class:`ConversionReport`, the meta stored with the weights, incl. ``model_cfg``)."""
    if src_format not in SRC_FORMATS or dst_format not in DST_FORMATS:
        raise ConversionError(f'--src-format must be one of {SRC_FORMATS} and --dst-format one of {DST_FORMATS}')
    if head_label_space is not None and (num_classes is not None or backbone_only):
        raise ConversionError('--head-label-space reorders the classifier, which --num-classes and --backbone-only '
                              'drop; pass one of them')
    src, config_file = resolve_source(src)
    if osp.realpath(src) == osp.realpath(dst) or (
            dst_format == 'transformers' and osp.realpath(osp.dirname(osp.abspath(src))) == osp.realpath(dst)):
        raise ConversionError(f'refusing to overwrite the source {src!r}; choose another DST')
    if src_format == 'auto':
        src_format = 'jax' if sniff_checkpoint(src) == 'npz' else 'torch'
    source = (_read_jax(src, pos_embed_grid, show_progress) if src_format == 'jax' else
              _read_torch(src, src_format, pos_embed_grid, config_file))
    state_dict, report, meta, bp = source.state_dict, source.report, source.meta, BACKBONE_PREFIX
    if arch:
        check_arch(arch, source.found, src)
    report.check(allow_unknown, allow_missing,
                 hint='If the file is of another kind, set --src-format (jax, timm, mmpretrain).')
    if bp + 'pos_embed' not in state_dict and not allow_missing:
        raise ConversionError(f'{src}: no position embedding found ({bp}pos_embed); not a ViT checkpoint')

    img_size = _change_patch_size(source, patch_size, img_size)
    if img_size is not None:
        kernel = state_dict[bp + 'patch_embed.proj.weight']
        _resize_to(state_dict, bp, img_size, tuple(kernel.shape[-2:]), source.reduction, report, pos_embed_mode)
        if 'model_cfg' in meta:
            meta['model_cfg']['img_size'] = to_2tuple(img_size)
    if pos_embed_mode is not None:
        state_dict[bp + MODE_KEY] = encode_resize_mode(pos_embed_mode)
    if head_label_space is not None:
        classes = meta.get('dataset_meta', {}).get('classes')
        state_dict, report, classes = convert_head_label_space(state_dict, *head_label_space, classes=classes,
                                                               report=report)
        if classes is not None:
            meta['dataset_meta'] = dict(meta['dataset_meta'], classes=classes)
    if num_classes is not None:
        state_dict, report = finetune_transfer(state_dict, num_classes, keep_pre_logits, report=report)
        if 'model_cfg' in meta:
            meta['num_classes'] = num_classes
    if backbone_only:
        state_dict, bp = _backbone_only(state_dict, report), ''
    if dst_format == 'transformers':
        heads = _num_heads(source, arch, num_heads)
        classes = meta.get('dataset_meta', {}).get('classes') if num_classes is None else None
        state_dict, hf_config, export = vit_to_transformers(state_dict, heads, classes=classes,
                                                            backbone_prefix=bp or BACKBONE_PREFIX, source=src)
        export.check(hint='transformers\' ViT has no place for these weights.')
        report.dropped += export.dropped
        report.notes += export.notes
        report.loaded = sorted(state_dict)
        write_transformers_folder(state_dict, hf_config, dst)
        return report, meta
    state_dict = _export(state_dict, dst_format, bp, src, report)
    report.loaded = sorted(state_dict)
    if dst.lower().endswith(SAFETENSORS_SUFFIX):
        write_safetensors(state_dict, dst, meta=None if dst_format == 'timm' else meta)
    else:
        atomic_torch_save(state_dict if dst_format == 'timm' else dict(state_dict=state_dict, meta=meta), dst)
    return report, meta


def atomic_torch_save(obj: Any, dst: str) -> None:
    """``torch.save`` to a temporary file next to ``dst``, renamed into place; never a partial ``dst``."""
    directory = osp.dirname(osp.abspath(dst))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix='.' + osp.basename(dst) + '.', suffix='.partial', dir=directory)
    try:
        with os.fdopen(fd, 'wb') as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, dst)
    except BaseException:
        if osp.exists(tmp):
            os.remove(tmp)
        raise
