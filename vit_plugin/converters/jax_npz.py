"""Official JAX/Flax ``.npz`` ViT checkpoints -> our state dicts, recording the official numerics.

See docs/checkpoints.md#official-npz-files-straight-from-a-config."""
import zipfile
import zlib
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import torch

from ..checkpoint.records import (GELU_KEY, MODE_KEY, NORM_EPS_KEY, NORM_KEY, OFFICIAL_INPUT_NORM, encode_gelu,
                                  encode_input_norm, encode_norm_eps, encode_resize_mode)
from ..models.pos_embed import infer_grid
from .common import BACKBONE_PREFIX, HEAD_PREFIX, ConversionError, ConversionReport, progress

PREFIXES = ('', 'opt/target/', 'params/')
_POS_KEYS = ('Transformer/posembed_input/pos_embedding', 'pos_embedding')
#: (attention, second LayerNorm, MLP) module indices of each naming scheme.
_NAMINGS = {'pre-linen': (1, 2, 3), 'linen': (0, 1, 0)}
_READ_ERRORS = (zipfile.BadZipFile, zlib.error, EOFError, OSError, ValueError)


def read_npz(filename: str) -> Mapping[str, np.ndarray]:
    """Open an ``.npz`` lazily without unpickling; FileNotFoundError, or ConversionError if unreadable."""
    try:
        arrays = np.load(filename, allow_pickle=False)
    except FileNotFoundError:
        raise
    except _READ_ERRORS as err:
        raise ConversionError(f'cannot read {filename!r} as an .npz archive ({type(err).__name__}: {err}). The '
                              f'file is truncated or not an official JAX checkpoint; download it again.') from None
    if not isinstance(arrays, np.lib.npyio.NpzFile):
        raise ConversionError(f'{filename!r} holds a single array, not the named arrays of a JAX checkpoint.')
    return arrays


class _Reader:
    """Reads arrays under a prefix, recording used and absent keys (``cache`` for scanned layouts)."""

    def __init__(self, arrays: Mapping[str, np.ndarray], prefix: str, source: str, cache: bool = True):
        self.arrays, self.prefix, self.source, self.cache = arrays, prefix, source, cache
        self.keys = set(arrays.keys()) if not hasattr(arrays, 'files') else set(arrays.files)
        self.used, self.missing, self._cache = set(), [], {}

    def has(self, key: str) -> bool:
        return self.prefix + key in self.keys

    def get(self, key: str) -> Optional[np.ndarray]:
        full = self.prefix + key
        if full not in self.keys:
            if full not in self.missing:
                self.missing.append(full)
            return None
        self.used.add(full)
        if full in self._cache:
            return self._cache[full]
        try:
            value = np.asarray(self.arrays[full])
        except _READ_ERRORS as err:
            raise ConversionError(f'{self.source}: cannot read array {full!r} ({type(err).__name__}: {err}); '
                                  f'the file is truncated or corrupt, download it again.') from None
        if value.dtype.kind != 'f':
            raise ConversionError(f'{self.source}: array {full!r} has dtype {value.dtype}, expected floats '
                                  f'(bfloat16 files must be cast to float32 first).')
        if self.cache:
            self._cache[full] = value
        return value

    def shape(self, key: str) -> Tuple[int, ...]:
        value = self.get(key)
        if value is None:
            raise ConversionError(f'{self.source}: required array {self.prefix + key!r} is missing, so the model '
                                  f'cannot be inferred; the file is not an official ViT checkpoint or is incomplete.')
        return value.shape


def inspect_jax_vit(arrays: Mapping[str, np.ndarray], source: str = 'checkpoint',
                    pos_embed_grid: Optional[Sequence[int]] = None) -> Dict[str, Any]:
    """The model stored in official ``arrays``: a dict of its sizes, layout and ``model_cfg``.

    ``pos_embed_grid``: the grid of a non-square position table; ``source`` names it in messages."""
    keys = list(arrays.files) if hasattr(arrays, 'files') else list(arrays.keys())
    prefix = next((p for p in PREFIXES if p + 'embedding/kernel' in keys), None)
    if prefix is None:
        raise ConversionError(
            f'{source}: no "embedding/kernel" array under any of the prefixes {PREFIXES} (found e.g. '
            f'{keys[:4]}), so this is not an official JAX ViT checkpoint. For PyTorch files use '
            f'--src-format timm or mmpretrain.')
    r = _Reader(arrays, prefix, source)
    scanned = r.has('Transformer/encoderblock/LayerNorm_0/scale')
    if scanned:
        num_layers = r.shape('Transformer/encoderblock/LayerNorm_0/scale')[0]
        block0 = 'Transformer/encoderblock/'
    else:
        num_layers = 0
        while r.has(f'Transformer/encoderblock_{num_layers}/LayerNorm_0/scale'):
            num_layers += 1
        block0 = 'Transformer/encoderblock_0/'
    if num_layers == 0:
        raise ConversionError(f'{source}: no encoder block found (expected {prefix}{block0}LayerNorm_0/scale); '
                              f'the file is not an official ViT checkpoint.')
    naming = next((n for n, (a, _, _) in _NAMINGS.items()
                   if r.has(f'{block0}MultiHeadDotProductAttention_{a}/query/kernel')), None)
    if naming is None:
        raise ConversionError(f'{source}: {prefix}{block0} has neither MultiHeadDotProductAttention_1 '
                              f'(pre-Linen) nor MultiHeadDotProductAttention_0 (Linen) query kernels.')
    attn, _, mlp = _NAMINGS[naming]
    kernel = r.shape('embedding/kernel')
    if len(kernel) != 4:
        raise ConversionError(f'{source}: {prefix}embedding/kernel has shape {kernel}, expected (kh, kw, in, D).')
    query = r.shape(f'{block0}MultiHeadDotProductAttention_{attn}/query/kernel')[int(scanned):]
    with_cls = r.has('cls')
    pos_key = next((k for k in _POS_KEYS if r.has(k)), _POS_KEYS[0])
    pos = r.shape(pos_key)
    grid = infer_grid(pos[-2] - int(with_cls), pos_embed_grid, what=prefix + pos_key)
    hybrid_layers, width_factor = None, 1
    if r.has('conv_root/kernel'):
        hybrid_layers = []
        while r.has(f'block{len(hybrid_layers) + 1}/unit1/conv1/kernel'):
            stage, units = len(hybrid_layers) + 1, 0
            while r.has(f'block{stage}/unit{units + 1}/conv1/kernel'):
                units += 1
            hybrid_layers.append(units)
        hybrid_layers = tuple(hybrid_layers)
        width_factor = r.shape('conv_root/kernel')[-1] // 64
    info = dict(prefix=prefix, naming=naming, scanned=scanned, embed_dims=kernel[3], num_layers=num_layers,
                num_heads=query[1], mlp_dims=r.shape(f'{block0}MlpBlock_{mlp}/Dense_0/kernel')[-1],
                patch_size=tuple(kernel[:2]), in_channels=kernel[2], with_cls_token=with_cls, grid=grid,
                pos_key=pos_key, num_classes=r.shape('head/kernel')[-1] if r.has('head/kernel') else None,
                pre_logits_dims=r.shape('pre_logits/kernel')[-1] if r.has('pre_logits/kernel') else None,
                hybrid_layers=hybrid_layers, width_factor=width_factor,
                # image pixels per feature-map pixel: the hybrid's ResNet stem is /4, each later stage /2
                reduction=1 if hybrid_layers is None else 4 * 2**max(len(hybrid_layers) - 1, 0))
    info['model_cfg'] = _model_cfg(info)
    return info


def _model_cfg(info: Dict[str, Any]) -> Dict[str, Any]:
    arch = dict(embed_dims=info['embed_dims'], num_layers=info['num_layers'], num_heads=info['num_heads'],
                mlp_dims=info['mlp_dims'])
    reduction = info['reduction']
    cfg = dict(type='vit_plugin.ViT', arch=arch)
    if info['hybrid_layers'] is not None:
        cfg = dict(type='vit_plugin.HybridViT', arch=arch, layers=info['hybrid_layers'],
                   width_factor=info['width_factor'])
    grid, patch = info['grid'], info['patch_size']
    cfg.update(img_size=(grid[0] * patch[0] * reduction, grid[1] * patch[1] * reduction), patch_size=patch,
               in_channels=info['in_channels'] if info['hybrid_layers'] is None else 3,
               with_cls_token=info['with_cls_token'], out_type='cls_token' if info['with_cls_token'] else 'gap',
               gelu_approximate='tanh', pos_embed_load_mode='official')
    return cfg


def _t(array: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(array))


def _dense(array):  # Flax Dense kernel (in, out) -> torch Linear weight (out, in)
    return _t(array.T)


def _conv(array):  # Flax conv kernel HWIO -> torch OIHW
    return _t(array.transpose(3, 2, 0, 1))


def _vector(array):  # GroupNorm/LayerNorm params: (C,) or, before flax 0.3.6, (1, 1, 1, C)
    return _t(array.reshape(-1))


def _plan_blocks(r: _Reader, info: Dict[str, Any], bp: str) -> List[Tuple[str, Callable[[], torch.Tensor]]]:
    attn, ln2, mlp = _NAMINGS[info['naming']]
    dim = info['embed_dims']
    plan = []
    for i in range(info['num_layers']):
        src = 'Transformer/encoderblock/' if info['scanned'] else f'Transformer/encoderblock_{i}/'

        def get(name, i=i, src=src):
            value = r.get(src + name)
            if value is None:
                return None
            return value[i] if info['scanned'] else value

        def qkv_weight(get=get):
            parts = [get(f'MultiHeadDotProductAttention_{attn}/{n}/kernel') for n in ('query', 'key', 'value')]
            return None if any(p is None for p in parts) else _t(np.concatenate([p.reshape(dim, -1).T for p in parts]))

        def qkv_bias(get=get):
            parts = [get(f'MultiHeadDotProductAttention_{attn}/{n}/bias') for n in ('query', 'key', 'value')]
            return None if any(p is None for p in parts) else _t(np.concatenate([p.reshape(-1) for p in parts]))

        def out_weight(get=get):
            value = get(f'MultiHeadDotProductAttention_{attn}/out/kernel')
            return None if value is None else _t(value.reshape(-1, dim).T)

        def simple(name, fn, get=get):
            return lambda: (lambda v: None if v is None else fn(v))(get(name))

        dst = f'{bp}blocks.{i}.'
        plan += [
            (dst + 'norm1.weight', simple('LayerNorm_0/scale', _vector)),
            (dst + 'norm1.bias', simple('LayerNorm_0/bias', _vector)),
            (dst + 'attn.qkv.weight', qkv_weight),
            (dst + 'attn.qkv.bias', qkv_bias),
            (dst + 'attn.proj.weight', out_weight),
            (dst + 'attn.proj.bias', simple(f'MultiHeadDotProductAttention_{attn}/out/bias', _vector)),
            (dst + 'norm2.weight', simple(f'LayerNorm_{ln2}/scale', _vector)),
            (dst + 'norm2.bias', simple(f'LayerNorm_{ln2}/bias', _vector)),
            (dst + 'mlp.fc1.weight', simple(f'MlpBlock_{mlp}/Dense_0/kernel', _dense)),
            (dst + 'mlp.fc1.bias', simple(f'MlpBlock_{mlp}/Dense_0/bias', _vector)),
            (dst + 'mlp.fc2.weight', simple(f'MlpBlock_{mlp}/Dense_1/kernel', _dense)),
            (dst + 'mlp.fc2.bias', simple(f'MlpBlock_{mlp}/Dense_1/bias', _vector)),
        ]
    return plan


def _plan_hybrid(r: _Reader, info: Dict[str, Any], bp: str) -> List[Tuple[str, Callable[[], torch.Tensor]]]:
    """Official R50 keys -> HybridViT's (timm ResNetV2) names under ``patch_embed.backbone``."""
    layers = info['hybrid_layers']
    stem = f'{bp}patch_embed.backbone.' + ('stem.' if layers else '')
    pairs = [(stem + 'conv.weight', 'conv_root/kernel', _conv), (stem + 'norm.weight', 'gn_root/scale', _vector),
             (stem + 'norm.bias', 'gn_root/bias', _vector)]
    for s, units in enumerate(layers):
        for u in range(units):
            src, dst = f'block{s + 1}/unit{u + 1}/', f'{bp}patch_embed.backbone.stages.{s}.blocks.{u}.'
            for n in (1, 2, 3):
                pairs += [(f'{dst}conv{n}.weight', f'{src}conv{n}/kernel', _conv),
                          (f'{dst}norm{n}.weight', f'{src}gn{n}/scale', _vector),
                          (f'{dst}norm{n}.bias', f'{src}gn{n}/bias', _vector)]
            if u == 0:
                pairs += [(f'{dst}downsample.conv.weight', f'{src}conv_proj/kernel', _conv),
                          (f'{dst}downsample.norm.weight', f'{src}gn_proj/scale', _vector),
                          (f'{dst}downsample.norm.bias', f'{src}gn_proj/bias', _vector)]
    return [(dst, (lambda src=src, fn=fn: (lambda v: None if v is None else fn(v))(r.get(src))))
            for dst, src, fn in pairs]


def convert_jax_vit(arrays: Mapping[str, np.ndarray],
                    source: str = 'checkpoint',
                    backbone_prefix: str = BACKBONE_PREFIX,
                    head_prefix: Optional[str] = HEAD_PREFIX,
                    pos_embed_grid: Optional[Sequence[int]] = None,
                    show_progress: bool = False) -> Tuple[Dict[str, torch.Tensor], ConversionReport, Dict[str, Any]]:
    """Convert official JAX arrays to our state dict (a pure function of the arrays).

    Args:
        arrays (Mapping[str, ndarray]): The archive (e.g. from :func:`read_npz`).
        source (str): Name used in messages and the report.
        backbone_prefix (str): Prefix of backbone keys. Defaults to 'backbone.'; '' for a bare one.
        head_prefix (str, optional): Prefix of the head. Defaults to 'head.layers.'; None drops it.
        pos_embed_grid (tuple[int, int], optional): Grid of a non-square position embedding.
        show_progress (bool): Progress bar on stderr. Defaults to False.

    Returns:
        tuple: (state dict, :class:`ConversionReport`, :func:`inspect_jax_vit` info). Unknown and
        missing keys are only reported; ``report.check()`` makes them errors.
    """
    info = inspect_jax_vit(arrays, source, pos_embed_grid)
    r = _Reader(arrays, info['prefix'], source, cache=info['scanned'])
    bp = backbone_prefix

    def simple(name, fn):
        return lambda: (lambda v: None if v is None else fn(v))(r.get(name))

    plan = [(bp + 'patch_embed.proj.weight', simple('embedding/kernel', _conv)),
            (bp + 'patch_embed.proj.bias', simple('embedding/bias', _vector))]
    if info['hybrid_layers'] is not None:
        plan = _plan_hybrid(r, info, bp) + plan
    if info['with_cls_token']:
        plan.append((bp + 'cls_token', simple('cls', lambda v: _t(v.reshape(1, 1, -1)))))
    plan.append((bp + 'pos_embed', simple(info['pos_key'], lambda v: _t(v.reshape(1, -1, v.shape[-1])))))
    plan += _plan_blocks(r, info, bp)
    plan += [(bp + 'norm.weight', simple('Transformer/encoder_norm/scale', _vector)),
             (bp + 'norm.bias', simple('Transformer/encoder_norm/bias', _vector))]
    report = ConversionReport(source=source)
    for name in ('pre_logits', 'head'):
        if not r.has(f'{name}/kernel'):
            continue
        if head_prefix is None:
            report.dropped += [r.prefix + f'{name}/kernel', r.prefix + f'{name}/bias']
            r.used.update(report.dropped[-2:])
            continue
        plan += [(f'{head_prefix}{name}.weight', simple(f'{name}/kernel', _dense)),
                 (f'{head_prefix}{name}.bias', simple(f'{name}/bias', _vector))]

    state_dict = {}
    for dst, fn in progress(plan, show_progress, f'converting {source}'):
        try:
            value = fn()
        except ConversionError:
            raise
        except (ValueError, IndexError) as err:
            raise ConversionError(f'{source}: the arrays for {dst!r} have inconsistent shapes ({err}); the file '
                                  f'is corrupt or mixes models.') from None
        if value is not None:
            state_dict[dst] = value
            report.loaded.append(dst)
    state_dict[bp + 'pos_embed_grid'] = torch.tensor(info['grid'], dtype=torch.long)
    state_dict[bp + MODE_KEY] = encode_resize_mode('official')
    state_dict[bp + GELU_KEY] = encode_gelu('tanh')  # the official model's jax.nn.gelu defaults to tanh
    state_dict[bp + NORM_EPS_KEY] = encode_norm_eps(1e-6)  # Flax's LayerNorm default
    # The official input pipeline feeds pixels scaled to [-1, 1]; ImageNet mean/std costs accuracy.
    state_dict[bp + NORM_KEY] = encode_input_norm(*OFFICIAL_INPUT_NORM)
    report.missing = list(r.missing)
    report.unknown = sorted(set(r.keys) - r.used)
    return state_dict, report, info


def load_official_npz(filename: str, map_location: Any = None) -> Dict[str, Any]:
    """Checkpoint loader for ``.npz`` files (whole-classifier layout); ConversionError for unknown or
    missing arrays."""
    arrays = read_npz(filename)
    try:
        state_dict, report, info = convert_jax_vit(arrays, source=filename)
    finally:
        arrays.close()
    report.check(hint='Inspect or override with tools/convert_checkpoint.py.')
    if isinstance(map_location, (str, torch.device)) and torch.device(map_location).type != 'cpu':
        state_dict = {k: v.to(map_location) for k, v in state_dict.items()}
    return dict(state_dict=state_dict, meta=dict(source_format='official-jax-npz', model_cfg=info['model_cfg'],
                                                 num_classes=info['num_classes']))
