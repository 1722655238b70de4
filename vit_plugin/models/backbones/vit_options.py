"""The backbone's keywords, ours and mmpretrain's, normalised to one set of settings; pure functions.

See docs/backbone.md#every-keyword-of-mmpretrains-visiontransformer."""
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from ..pos_embed import to_2tuple

#: What each output of the backbone is (``'gap'`` is ours, the other four are mmpretrain's).
OUT_TYPES = ('cls_token', 'gap', 'avg_featmap', 'featmap', 'raw')

#: MLP kinds, by mmpretrain's ``ffn_type`` names: the Transformer's GELU MLP, and DINOv2-g's SwiGLU
#: with one packed input projection.
FFN_TYPES = ('origin', 'swiglu_fused')

#: How inputs whose size the patch size does not divide are zero-padded (mmcv ``PatchEmbed``'s
#: adaptive padding): 'corner' at the bottom/right, 'same' on both sides (the extra pixel at the
#: bottom/right).
PATCH_PADDINGS = ('corner', 'same')

#: LayerNorm epsilon of the official model and of mmpretrain's default ``norm_cfg``.
DEFAULT_NORM_EPS = 1e-6

#: mmpretrain's ``build_norm_layer`` default when a ``norm_cfg`` gives no ``eps``.
_MMPRETRAIN_CFG_EPS = 1e-5
_LAYER_NORM_TYPES = ('LN', 'LayerNorm')


def norm_eps_from_cfg(norm_cfg: Any, what: str = 'norm_cfg') -> float:
    """The eps of an mmpretrain LayerNorm config (1e-5 without ``eps``, as mmpretrain); else ValueError."""
    if not isinstance(norm_cfg, Mapping) or 'type' not in norm_cfg:
        raise ValueError(f"{what} must be a dict with a 'type', e.g. dict(type='LN', eps=1e-6), got {norm_cfg!r}")
    if norm_cfg['type'] not in _LAYER_NORM_TYPES:
        raise ValueError(f"{what}: type={norm_cfg['type']!r} is not supported: every norm of this ViT is a "
                         f"LayerNorm. Use dict(type='LN', eps=...).")
    unknown = sorted(set(norm_cfg) - {'type', 'eps'})
    if unknown:
        hint = (' To keep norms fixed, use frozen_stages or an optimizer paramwise_cfg with lr_mult=0.'
                if 'requires_grad' in unknown else '')
        raise ValueError(f"{what}: unknown key(s) {unknown}; only 'type' (LN) and 'eps' have a meaning here.{hint}")
    return float(norm_cfg.get('eps', _MMPRETRAIN_CFG_EPS))


def resolve_norm_eps(norm_eps: Optional[float], norm_cfg: Optional[Mapping]) -> float:
    """One LayerNorm epsilon from our ``norm_eps`` and mmpretrain's ``norm_cfg`` (either, or both agreeing)."""
    if norm_cfg is None:
        return DEFAULT_NORM_EPS if norm_eps is None else float(norm_eps)
    eps = norm_eps_from_cfg(norm_cfg)
    if norm_eps is not None and float(norm_eps) != eps:
        raise ValueError(f'norm_eps={norm_eps} and norm_cfg={dict(norm_cfg)!r} (eps {eps}) say different things; '
                         f'keep one of them.')
    return eps


# ------------------------------------------------------------------------------------ patch embedding
@dataclass(frozen=True)
class PatchSettings:
    """How images become patches; ``padding`` one of :data:`PATCH_PADDINGS`, or None to refuse bad sizes."""
    patch_size: Tuple[int, int]
    img_size: Tuple[int, int]
    in_channels: int
    bias: bool
    padding: Optional[str]


#: ``patch_cfg`` keys with a meaning here (mmcv ``PatchEmbed``'s arguments).
PATCH_CFG_KEYS = ('in_channels', 'input_size', 'embed_dims', 'conv_type', 'kernel_size', 'stride', 'padding',
                  'dilation', 'bias', 'norm_cfg', 'init_cfg')


def _patch_padding(cfg: Mapping, pad_to_patch: bool) -> Optional[str]:
    if 'padding' not in cfg:
        return 'corner' if pad_to_patch else None
    padding = cfg['padding']
    if isinstance(padding, str):
        if padding not in PATCH_PADDINGS:
            raise ValueError(f'patch_cfg: padding={padding!r} is not one of {PATCH_PADDINGS} (or 0).')
        mode = padding
    elif to_2tuple(padding) == (0, 0):
        mode = None
    else:
        raise ValueError(f'patch_cfg: padding={padding!r} would pad every image by a fixed amount before cutting '
                         f"patches, which a ViT patch embedding does not do; use padding='corner' (or 'same') to "
                         f'pad only inputs that the patch size does not divide, or 0.')
    if pad_to_patch and mode != 'corner':
        raise ValueError(f"pad_to_patch=True (zero-pad the bottom/right) contradicts patch_cfg padding={padding!r}; "
                         f'keep one of them.')
    return mode


def patch_settings(patch_cfg: Optional[Mapping], patch_size: Union[int, Sequence[int]],
                   img_size: Union[int, Sequence[int]], in_channels: int, embed_dims: int, pad_to_patch: bool,
                   pre_norm: bool) -> PatchSettings:
    """Our patch keywords with mmpretrain's ``patch_cfg`` applied over them (``patch_cfg`` wins)."""
    cfg = dict(patch_cfg or {})
    unknown = sorted(set(cfg) - set(PATCH_CFG_KEYS))
    if unknown:
        raise ValueError(f'patch_cfg: unknown key(s) {unknown}; it takes {list(PATCH_CFG_KEYS)}.')
    if cfg.get('conv_type', 'Conv2d') != 'Conv2d':
        raise ValueError(f"patch_cfg: conv_type={cfg['conv_type']!r} is not supported; the patch projection is one "
                         f"nn.Conv2d (conv_type='Conv2d').")
    if to_2tuple(cfg.get('dilation', 1)) != (1, 1):
        raise ValueError(f"patch_cfg: dilation={cfg['dilation']!r}: patches are contiguous pixels; use dilation=1.")
    if cfg.get('norm_cfg') is not None:
        raise ValueError('patch_cfg: norm_cfg (a norm after the patch projection) is not part of this ViT; use '
                         'pre_norm=True for a LayerNorm on the embedded tokens.')
    if cfg.get('init_cfg') is not None:
        raise ValueError("patch_cfg: init_cfg is not supported for the patch embedding alone; give the backbone's "
                         "init_cfg, e.g. dict(type='Kaiming', layer='Conv2d').")
    if cfg.get('embed_dims', embed_dims) != embed_dims:
        raise ValueError(f"patch_cfg: embed_dims={cfg['embed_dims']} differs from the arch's width {embed_dims}; "
                         f'the width is set by arch.')
    kernel = to_2tuple(cfg.get('kernel_size', patch_size))
    stride = cfg.get('stride', patch_size)
    stride = kernel if stride is None else to_2tuple(stride)  # mmcv: stride None = kernel size
    if kernel != stride:
        raise ValueError(f'patch_cfg: kernel_size {kernel} and stride {stride} differ (overlapping patches); a ViT '
                         f'cuts non-overlapping patches: set patch_size (or both to the same value).')
    input_size = cfg.get('input_size', img_size)
    if input_size is None:
        raise ValueError('patch_cfg: input_size=None leaves the position-embedding grid undefined; give img_size.')
    return PatchSettings(patch_size=kernel, img_size=to_2tuple(input_size),
                         in_channels=int(cfg.get('in_channels', in_channels)), bias=bool(cfg.get('bias', not pre_norm)),
                         padding=_patch_padding(cfg, pad_to_patch))


# ------------------------------------------------------------------------------------ encoder blocks
#: ``layer_cfgs`` keys (mmpretrain ``TransformerEncoderLayer`` arguments) that set an
#: :class:`~vit_plugin.models.layers.EncoderBlock` argument of the same meaning.
_LAYER_CFG_TO_BLOCK = dict(drop_rate='drop', attn_drop_rate='attn_drop', drop_path_rate='drop_path',
                           qkv_bias='qkv_bias', layer_scale_init_value='layer_scale_init_value', ffn_type='ffn_type')
#: ``layer_cfgs`` keys that repeat the arch: accepted when they agree with it.
_LAYER_CFG_ARCH = dict(embed_dims='embed_dims', num_heads='num_heads', feedforward_channels='mlp_dims')
LAYER_CFG_KEYS = (*_LAYER_CFG_TO_BLOCK, *_LAYER_CFG_ARCH, 'norm_cfg', 'act_cfg', 'num_fcs', 'init_cfg')


#: ``act_cfg`` types: mmcv's GELU, and mmpretrain's QuickGELU (CLIP's configs name it either way).
_ACT_TYPES = {'GELU': 'gelu', 'QuickGELU': 'quick_gelu', 'mmpretrain.QuickGELU': 'quick_gelu'}


def _activation_from_act_cfg(act_cfg: Any, what: str) -> Dict[str, str]:
    """``activation`` and ``gelu_approximate`` of an :class:`~vit_plugin.models.layers.Mlp` from an ``act_cfg``."""
    kind = _ACT_TYPES.get(act_cfg.get('type')) if isinstance(act_cfg, Mapping) else None
    if kind is None:
        raise ValueError(f"{what}: {act_cfg!r} is not supported; the MLP activation is dict(type='GELU') (also with "
                         f"approximate='tanh') or CLIP's dict(type='QuickGELU').")
    allowed = {'type', 'approximate'} if kind == 'gelu' else {'type'}
    unknown = sorted(set(act_cfg) - allowed)
    if unknown:
        raise ValueError(f'{what}: unknown key(s) {unknown} for {act_cfg["type"]}; it takes '
                         f'{sorted(allowed - {"type"})}.')
    approximate = act_cfg.get('approximate', 'none')
    if approximate not in ('none', 'tanh'):
        raise ValueError(f"{what}: approximate={approximate!r}; use 'none' or 'tanh'.")
    return dict(activation=kind, gelu_approximate=approximate)


def _apply_layer_cfg(settings: Dict[str, Any], cfg: Mapping, arch: Mapping, what: str) -> None:
    unknown = sorted(set(cfg) - set(LAYER_CFG_KEYS))
    if unknown:
        raise ValueError(f'{what}: unknown key(s) {unknown}; it takes {list(LAYER_CFG_KEYS)}.')
    for key, value in cfg.items():
        if key in _LAYER_CFG_TO_BLOCK:
            settings[_LAYER_CFG_TO_BLOCK[key]] = value
        elif key in _LAYER_CFG_ARCH:
            if value != arch[_LAYER_CFG_ARCH[key]]:
                raise ValueError(f'{what}: {key}={value} differs from the arch ({_LAYER_CFG_ARCH[key]}='
                                 f'{arch[_LAYER_CFG_ARCH[key]]}); every block has the arch\'s sizes: set them in arch.')
        elif key == 'norm_cfg':
            settings['norm_eps'] = norm_eps_from_cfg(value, f'{what}.norm_cfg')
        elif key == 'act_cfg':
            settings.update(_activation_from_act_cfg(value, f'{what}.act_cfg'))
        elif key == 'num_fcs' and value != 2:
            raise ValueError(f'{what}: num_fcs={value}; the MLP has two dense layers (num_fcs=2).')
        elif key == 'init_cfg' and value is not None:
            raise ValueError(f"{what}: init_cfg is not supported per block; give the backbone's init_cfg.")
    if settings['ffn_type'] not in FFN_TYPES:
        raise ValueError(f"{what}: ffn_type={settings['ffn_type']!r} is not one of {FFN_TYPES}.")


def block_settings(layer_cfgs: Union[None, Mapping, Sequence[Mapping]], arch: Mapping[str, int],
                   defaults: Mapping[str, Any], drop_path_rate: float) -> List[Dict[str, Any]]:
    """``num_layers`` dicts of ``EncoderBlock`` arguments: ``defaults``, drop path, then ``layer_cfgs``."""
    depth = arch['num_layers']
    if layer_cfgs is None:
        cfgs: Sequence[Mapping] = [{}] * depth
    elif isinstance(layer_cfgs, Mapping):
        cfgs = [layer_cfgs] * depth
    elif isinstance(layer_cfgs, Sequence) and not isinstance(layer_cfgs, str):
        cfgs = list(layer_cfgs)
        if len(cfgs) != depth or not all(isinstance(c, Mapping) for c in cfgs):
            raise ValueError(f'layer_cfgs must be one dict or a list of {depth} dicts (one per block), got '
                             f'{len(cfgs)} entries.')
    else:
        raise ValueError(f'layer_cfgs must be a dict or a list of dicts, got {type(layer_cfgs).__name__}.')
    settings = []
    for i, cfg in enumerate(cfgs):
        block = dict(defaults, drop_path=drop_path_rate * i / max(depth - 1, 1))
        _apply_layer_cfg(block, cfg, arch, f'layer_cfgs[{i}]' if not isinstance(layer_cfgs, Mapping) else 'layer_cfgs')
        settings.append(block)
    return settings
