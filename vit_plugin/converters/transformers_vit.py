"""``transformers``' ViT state dicts and configs <-> ours, eps and activation recorded.

See docs/checkpoints.md#the-papers-weights-from-the-hugging-face-hub."""
import json
import math
import os.path as osp
import re
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
from mmengine.logging import print_log

from ..checkpoint.records import (GELU_KEY, NORM_EPS_KEY, RECORD_KEYS, decode_gelu, decode_norm_eps, encode_gelu,
                                  encode_norm_eps)
from .common import BACKBONE_PREFIX, HEAD_PREFIX, ConversionError, ConversionReport, unwrap_state_dict

#: ``hidden_act`` values and the GELU of ours that computes them ('none': exact erf GELU, 'tanh': its
#: tanh approximation; ``gelu_new`` and ``gelu_fast`` are the same formula written out).
HF_ACTIVATIONS = dict(gelu='none', gelu_pytorch_tanh='tanh', gelu_new='tanh', gelu_fast='tanh')

#: transformers' ``ViTConfig`` default epsilon, assumed by nothing: a file without config says nothing.
HF_DEFAULT_EPS = 1e-12

_BLOCK = re.compile(r'encoder\.layer\.(\d+)\.(.+)')
_BLOCK_PARTS = {
    'layernorm_before': 'norm1', 'layernorm_after': 'norm2', 'attention.output.dense': 'attn.proj',
    'intermediate.dense': 'mlp.fc1', 'output.dense': 'mlp.fc2'}
_QKV = ('query', 'key', 'value')


def is_transformers_vit(state_dict: Dict[str, Any]) -> bool:
    """Whether a state dict has ``transformers``' ViT key names (with or without ``vit.``)."""
    return any(k in state_dict for k in ('embeddings.patch_embeddings.projection.weight',
                                         'vit.embeddings.patch_embeddings.projection.weight'))


def read_transformers_config(path: str) -> Optional[Dict[str, Any]]:
    """A ``config.json`` of ``transformers``' ViT, or None when the file is another library's (timm's)."""
    with open(path) as f:
        config = json.load(f)
    return config if config.get('model_type') == 'vit' else None


def _activation(config: Dict[str, Any], source: str) -> str:
    act = config.get('hidden_act', 'gelu')
    if act not in HF_ACTIVATIONS:
        raise ConversionError(f'{source}: hidden_act={act!r} in config.json; this ViT runs GELU only '
                              f'({", ".join(HF_ACTIVATIONS)}).')
    return HF_ACTIVATIONS[act]


def _pair(value) -> Tuple[int, int]:
    return (int(value), int(value)) if isinstance(value, (int, float)) else tuple(int(v) for v in value)


def transformers_to_vit(state_dict: Dict[str, torch.Tensor],
                        config: Optional[Dict[str, Any]] = None,
                        backbone_prefix: str = BACKBONE_PREFIX,
                        head_prefix: Optional[str] = HEAD_PREFIX,
                        source: str = 'transformers state dict'
                        ) -> Tuple[Dict[str, torch.Tensor], ConversionReport, Dict[str, Any]]:
    """``ViTModel`` / ``ViTForImageClassification`` state dict (and its ``config.json``) -> ours.

    Args:
        state_dict (dict): transformers weights, with or without the ``vit.`` prefix.
        config (dict, optional): The ``config.json``; without it eps, GELU and classes are unknown
            and nothing is recorded.
        backbone_prefix (str): Prefix of our backbone keys. Defaults to 'backbone.'.
        head_prefix (str, optional): Prefix of the head. Defaults to 'head.layers.'; None drops the
            pooler and classifier (reported).
        source (str): Name used in the report and errors.

    Returns:
        tuple: (our state dict, :class:`ConversionReport`, info dict: ``model_cfg`` (with ``config``),
        ``classes``, ``norm_eps``, ``gelu_approximate`` (None when unknown)).
    """
    report = ConversionReport(source=source)
    sd = {k[len('vit.'):] if k.startswith('vit.') else k: v for k, v in state_dict.items()}
    bp, out = backbone_prefix, {}
    blocks: Dict[int, Dict[str, torch.Tensor]] = {}

    def put(key, value):
        out[key] = value
        report.loaded.append(key)

    with_head = 'classifier.weight' in sd
    for key, value in sd.items():
        block = _BLOCK.match(key)
        if key == 'embeddings.cls_token':
            put(bp + 'cls_token', value)
        elif key == 'embeddings.position_embeddings':
            put(bp + 'pos_embed', value)
        elif key.startswith('embeddings.patch_embeddings.projection.'):
            put(bp + 'patch_embed.proj.' + key.rsplit('.', 1)[1], value)
        elif key == 'embeddings.mask_token':  # ViTForMaskedImageModeling's: a classifier never masks
            report.dropped.append(key)
        elif key.startswith('layernorm.'):
            put(bp + 'norm.' + key.rsplit('.', 1)[1], value)
        elif block:
            index, rest = int(block.group(1)), block.group(2)
            name, _, kind = rest.rpartition('.')
            if name in _BLOCK_PARTS:
                put(f'{bp}blocks.{index}.{_BLOCK_PARTS[name]}.{kind}', value)
            elif name.startswith('attention.attention.') and name.rsplit('.', 1)[1] in _QKV:
                blocks.setdefault(index, {})[name.rsplit('.', 1)[1] + '.' + kind] = value
            else:
                report.unknown.append(key)
        elif key.startswith('pooler.dense.') and head_prefix is not None and not with_head:
            put(head_prefix + 'pre_logits.' + key.rsplit('.', 1)[1], value)
        elif key.startswith('classifier.') and head_prefix is not None:
            put(head_prefix + 'head.' + key.rsplit('.', 1)[1], value)
        elif key.startswith(('pooler.dense.', 'classifier.')):
            report.dropped.append(key)  # the pooler: ViTForImageClassification's classifier never reads it
        else:
            report.unknown.append(key)
    for index, parts in sorted(blocks.items()):
        for kind in ('weight', 'bias'):
            found = [parts.get(f'{name}.{kind}') for name in _QKV]
            if all(t is None for t in found):
                continue
            if any(t is None for t in found):
                report.missing.append(f'encoder.layer.{index}.attention.attention.{{query,key,value}}.{kind}')
                continue
            put(f'{bp}blocks.{index}.attn.qkv.{kind}', torch.cat(found, dim=0))
    depth = len(blocks)
    for index in range(depth):
        for ours in ('norm1', 'norm2', 'attn.proj', 'mlp.fc1', 'mlp.fc2', 'attn.qkv'):
            if f'{bp}blocks.{index}.{ours}.weight' not in out:
                report.missing.append(f'{bp}blocks.{index}.{ours}.weight')
    for key in ('cls_token', 'pos_embed', 'patch_embed.proj.weight', 'norm.weight'):
        if bp + key not in out:
            report.missing.append(bp + key)

    info: Dict[str, Any] = dict(model_cfg=None, classes=None, norm_eps=None, gelu_approximate=None)
    kernel, table = out.get(bp + 'patch_embed.proj.weight'), out.get(bp + 'pos_embed')
    if config is not None:
        info['norm_eps'] = float(config.get('layer_norm_eps', HF_DEFAULT_EPS))
        info['gelu_approximate'] = _activation(config, source)
        out[bp + NORM_EPS_KEY] = encode_norm_eps(info['norm_eps'])
        if info['gelu_approximate'] == 'tanh':
            out[bp + GELU_KEY] = encode_gelu('tanh')
        patch = _pair(config.get('patch_size', 16))
        img = _pair(config.get('image_size', 224))
        grid = (img[0] // patch[0], img[1] // patch[1])
        if table is not None and table.shape[1] - 1 == grid[0] * grid[1]:
            out[bp + 'pos_embed_grid'] = torch.tensor(grid, dtype=torch.long)
        if kernel is not None and table is not None:
            info['model_cfg'] = dict(
                arch=dict(embed_dims=int(config['hidden_size']), num_layers=int(config['num_hidden_layers']),
                          num_heads=int(config['num_attention_heads']), mlp_dims=int(config['intermediate_size'])),
                img_size=img, patch_size=tuple(kernel.shape[-2:]), in_channels=int(kernel.shape[1]),
                qkv_bias=bool(config.get('qkv_bias', True)), norm_eps=info['norm_eps'],
                gelu_approximate=info['gelu_approximate'])
        labels = config.get('id2label') or {}
        classes = [labels.get(str(i), labels.get(i)) for i in range(len(labels))]
        if with_head and len(classes) == sd['classifier.weight'].shape[0] and all(classes) and \
                classes != [f'LABEL_{i}' for i in range(len(classes))]:
            info['classes'] = [str(c) for c in classes]
    elif table is not None and math.isqrt(table.shape[1] - 1) ** 2 == table.shape[1] - 1:
        side = math.isqrt(table.shape[1] - 1)
        out[bp + 'pos_embed_grid'] = torch.tensor((side, side), dtype=torch.long)
    return out, report, info


def vit_to_transformers(state_dict: Dict[str, torch.Tensor],
                        num_heads: int,
                        classes: Optional[Sequence[str]] = None,
                        backbone_prefix: str = BACKBONE_PREFIX,
                        head_prefix: str = HEAD_PREFIX,
                        norm_eps: Optional[float] = None,
                        gelu_approximate: Optional[str] = None,
                        source: str = 'vit_plugin state dict'
                        ) -> Tuple[Dict[str, torch.Tensor], Dict[str, Any], ConversionReport]:
    """Our state dict -> a ``transformers`` ViT state dict and its ``config.json``.

    With a head: ``ViTForImageClassification``; else ``ViTModel`` (pooler from ``pre_logits``). A head
    above ``pre_logits`` is dropped; weights transformers has no place for are unknown keys.

    Args:
        state_dict (dict): Ours (whole classifier or bare backbone).
        num_heads (int): Attention heads (the weights do not say).
        classes (Sequence[str], optional): Class names for ``id2label``.
        backbone_prefix (str): Defaults to 'backbone.'.
        head_prefix (str): Defaults to 'head.layers.'.
        norm_eps (float, optional): LayerNorm eps; None: the recorded one, else 1e-6.
        gelu_approximate (str, optional): None: the recorded GELU, else 'none'.
        source (str): Name used in the report.

    Returns:
        tuple: (transformers state dict, config dict, :class:`ConversionReport`).
    """
    report = ConversionReport(source=source)
    bp = backbone_prefix if any(k.startswith(backbone_prefix) for k in state_dict) else ''
    inner = {k[len(bp):]: v for k, v in state_dict.items() if k.startswith(bp)} if bp else dict(state_dict)
    rest = {k: v for k, v in state_dict.items() if bp and not k.startswith(bp)}
    if norm_eps is None:
        norm_eps = decode_norm_eps(inner[NORM_EPS_KEY]) if NORM_EPS_KEY in inner else 1e-6
    if gelu_approximate is None:
        gelu_approximate = decode_gelu(inner[GELU_KEY]) if GELU_KEY in inner else 'none'
    head_w, pre_w = rest.get(head_prefix + 'head.weight'), rest.get(head_prefix + 'pre_logits.weight')
    classify = head_w is not None and pre_w is None
    top = 'vit.' if classify else ''
    out: Dict[str, torch.Tensor] = {}

    def put(key, value):
        out[top + key] = value
        report.loaded.append(top + key)

    simple = {'cls_token': 'embeddings.cls_token', 'pos_embed': 'embeddings.position_embeddings',
              'patch_embed.proj.weight': 'embeddings.patch_embeddings.projection.weight',
              'patch_embed.proj.bias': 'embeddings.patch_embeddings.projection.bias',
              'norm.weight': 'layernorm.weight', 'norm.bias': 'layernorm.bias'}
    back = {v: k for k, v in _BLOCK_PARTS.items()}
    for key, value in inner.items():
        block = re.match(r'blocks\.(\d+)\.(.+)\.(weight|bias)$', key)
        if key in simple:
            put(simple[key], value)
        elif key in ('pos_embed_grid', *RECORD_KEYS):
            report.dropped.append(bp + key)  # the config carries grid, eps and GELU
        elif block and block.group(2) == 'attn.qkv':
            for name, part in zip(_QKV, value.chunk(3, dim=0)):
                put(f'encoder.layer.{block.group(1)}.attention.attention.{name}.{block.group(3)}', part.clone())
        elif block and block.group(2) in back:
            put(f'encoder.layer.{block.group(1)}.{back[block.group(2)]}.{block.group(3)}', value)
        else:
            report.unknown.append(bp + key)
    for key, value in rest.items():
        name = key[len(head_prefix):] if key.startswith(head_prefix) else None
        if name in ('pre_logits.weight', 'pre_logits.bias'):
            put('pooler.dense.' + name.rsplit('.', 1)[1], value)
        elif name in ('head.weight', 'head.bias') and classify:
            out['classifier.' + name.rsplit('.', 1)[1]] = value
            report.loaded.append('classifier.' + name.rsplit('.', 1)[1])
        elif name in ('head.weight', 'head.bias'):
            report.dropped.append(key)
            if name == 'head.weight':
                report.notes.append(f'{key}: transformers\' classifier reads the class token, not a pre-logits '
                                    f'layer; the head is dropped and pre_logits kept as the pooler (ViTModel)')
        else:
            report.unknown.append(key)
    if 'cls_token' not in inner:
        report.unknown.append(bp + 'pos_embed (a model without class token)')
    kernel, table = inner['patch_embed.proj.weight'], inner['pos_embed']
    grid = tuple(int(v) for v in inner['pos_embed_grid'].tolist()) if 'pos_embed_grid' in inner else \
        (math.isqrt(table.shape[1] - 1), ) * 2
    patch = tuple(kernel.shape[-2:])
    image = (grid[0] * patch[0], grid[1] * patch[1])
    depth = len({int(m.group(1)) for k in inner for m in [re.match(r'blocks\.(\d+)\.', k)] if m})
    embed = int(table.shape[-1])
    config: Dict[str, Any] = dict(
        model_type='vit', architectures=['ViTForImageClassification' if classify else 'ViTModel'],
        hidden_size=embed, num_hidden_layers=depth, num_attention_heads=int(num_heads),
        intermediate_size=int(inner['blocks.0.mlp.fc1.weight'].shape[0]),
        hidden_act='gelu_pytorch_tanh' if gelu_approximate == 'tanh' else 'gelu',
        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, initializer_range=0.02,
        layer_norm_eps=float(norm_eps), image_size=image[0] if image[0] == image[1] else list(image),
        patch_size=patch[0] if patch[0] == patch[1] else list(patch), num_channels=int(kernel.shape[1]),
        qkv_bias='blocks.0.attn.qkv.bias' in inner, encoder_stride=patch[0], pooler_act='tanh',
        pooler_output_size=int(pre_w.shape[0]) if pre_w is not None else embed)
    if classify:
        names = list(classes) if classes else [f'LABEL_{i}' for i in range(head_w.shape[0])]
        config['id2label'] = {str(i): str(n) for i, n in enumerate(names)}
        config['label2id'] = {str(n): i for i, n in enumerate(names)}
    return out, config, report


def _in_checkpoint(checkpoint) -> Dict[str, torch.Tensor]:
    return unwrap_state_dict(checkpoint) if isinstance(checkpoint, dict) else {}


def adapt_transformers_checkpoint(checkpoint: Any, weights: str, config_file: Optional[str]) -> Any:
    """Safe-loader adapter: a ``transformers`` ViT checkpoint becomes ours as it loads, eps, GELU and class
    names from the ``config.json`` beside it (else a warning); others are returned unchanged.

    Raises ConversionError for weights ours cannot hold, or missing ones."""
    state_dict = _in_checkpoint(checkpoint)
    if not is_transformers_vit(state_dict):
        return checkpoint
    config = read_transformers_config(config_file) if config_file else None
    out, report, info = transformers_to_vit(state_dict, config, source=weights)
    report.check(hint='Is this a transformers ViT checkpoint (ViTModel / ViTForImageClassification)?')
    meta: Dict[str, Any] = dict(source=osp.basename(weights), source_format='transformers')
    if info['classes']:
        meta['dataset_meta'] = dict(classes=info['classes'])
    if config is None:
        print_log(f'{weights}: transformers ViT weights without config.json next to them: their LayerNorm eps '
                  f'and GELU are unknown, so the model keeps its own (transformers\' default is eps={HF_DEFAULT_EPS:g}, '
                  f'exact GELU). Put the repository\'s config.json next to the file.', logger='current',
                  level=30)
    else:
        print_log(f'{weights}: transformers ViT layout converted to vit_plugin\'s ({len(report.loaded)} tensors); '
                  f'config.json: layer_norm_eps={info["norm_eps"]:g}, hidden_act={config.get("hidden_act", "gelu")} '
                  f'(gelu_approximate={info["gelu_approximate"]!r}), recorded with the weights.', logger='current')
    return dict(state_dict=out, meta=meta)


def classes_of(checkpoint: Any) -> Optional[List[str]]:
    """Class names recorded in a checkpoint's meta (mmpretrain's ``dataset_meta``), or None."""
    meta = checkpoint.get('meta') if isinstance(checkpoint, dict) else None
    classes = ((meta or {}).get('dataset_meta') or {}).get('classes')
    return list(classes) if classes else None
