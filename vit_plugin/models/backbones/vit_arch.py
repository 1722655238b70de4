"""The ViT architectures by name: one table, with its aliases, and the parsing of an ``arch`` argument.

The table does not depend on the model: this module imports nothing from the rest of the package (nor
torch), and the converters and tools read the names from here, not from the ``ViT`` class.

The names are those of the paper (Ti and S from the DeiT and "How to train your ViT" papers; B, L, H
from Table 1) and those of mmpretrain's ``VisionTransformer.arch_zoo`` for its plain-ViT families:
DeiT, DINOv2 and EVA-g. An arch fixes the four sizes only, as in mmpretrain; patch size, image size,
layer scale and the MLP type are keywords of the backbone (DINOv2's configs: ``patch_size=14``,
``img_size=518``, ``layer_scale_init_value=1e-5``, and for the giant model
``layer_cfgs=dict(ffn_type='swiglu_fused')``).

One name differs from mmpretrain: ``'s'``/``'small'`` is ViT-S (384 wide, 12 blocks, 6 heads, MLP
1536), the model of DeiT-S and of the later ViT papers; mmpretrain's ``'small'`` is an older 768-wide,
8-block model (MLP 2304) that none of mmpretrain's 1.2.0 configs uses. A config that means the
latter gives it as a dict: ``arch=dict(embed_dims=768, num_layers=8, num_heads=8, feedforward_channels=2304)``.
"""
from typing import Any, Dict, Mapping, Tuple, Union

#: The four numbers an arch fixes.
ARCH_KEYS = ('embed_dims', 'num_layers', 'num_heads', 'mlp_dims')


def _arch(embed_dims: int, num_layers: int, num_heads: int, mlp_dims: int) -> Dict[str, int]:
    return dict(embed_dims=embed_dims, num_layers=num_layers, num_heads=num_heads, mlp_dims=mlp_dims)


def _expand_aliases(table: Mapping[Tuple[str, ...], dict]) -> Dict[str, dict]:
    return {alias: spec for aliases, spec in table.items() for alias in aliases}


#: Every arch name (aliases included) -> its sizes. ``ViT.arch_zoo`` is this dict.
VIT_ARCHS: Dict[str, Dict[str, int]] = _expand_aliases({
    ('ti', 'tiny'): _arch(192, 12, 3, 768),
    ('s', 'small'): _arch(384, 12, 6, 1536),
    ('b', 'base'): _arch(768, 12, 12, 3072),
    ('l', 'large'): _arch(1024, 24, 16, 4096),
    ('h', 'huge'): _arch(1280, 32, 16, 5120),
    # DeiT (Touvron et al., 2021): the same shapes as Ti/S/B, trained with distillation-era recipes.
    ('deit-t', 'deit-tiny'): _arch(192, 12, 3, 768),
    ('deit-s', 'deit-small'): _arch(384, 12, 6, 1536),
    ('deit-b', 'deit-base'): _arch(768, 12, 12, 3072),
    # DINOv2 (Oquab et al., 2023): S/B/L are the ViT shapes; mmpretrain names S and g, its B and L
    # configs use 'base' and 'large'. The giant model's MLP is SwiGLU (layer_cfgs ffn_type).
    ('dinov2-s', 'dinov2-small'): _arch(384, 12, 6, 1536),
    ('dinov2-b', 'dinov2-base'): _arch(768, 12, 12, 3072),
    ('dinov2-l', 'dinov2-large'): _arch(1024, 24, 16, 4096),
    ('dinov2-g', 'dinov2-giant'): _arch(1536, 40, 24, 6144),
    # EVA-g (Fang et al., 2023), as mmpretrain's VisionTransformer defines it: a plain ViT-g/14 shape.
    ('eva-g', 'eva-giant'): _arch(1408, 40, 16, 6144),
})


def parse_arch(arch: Union[str, Mapping[str, Any]], table: Mapping[str, dict] = VIT_ARCHS) -> Dict[str, int]:
    """The sizes an ``arch`` argument names: a key of ``table`` (any case) or a dict.

    A dict takes ``embed_dims``, ``num_layers``, ``num_heads`` and ``mlp_dims``, or mmpretrain's name for
    the MLP width, ``feedforward_channels`` (its arch dicts are accepted as they are).

    Raises:
        KeyError: an unknown name.
        ValueError: a dict with missing, unknown or contradictory keys.
    """
    if isinstance(arch, str):
        key = arch.lower()
        if key not in table:
            raise KeyError(f'unknown ViT arch {arch!r}; choose one of {sorted(set(table))} '
                           f'or pass a dict with embed_dims, num_layers, num_heads, mlp_dims')
        return dict(table[key])
    required = set(ARCH_KEYS)
    if isinstance(arch, Mapping) and 'feedforward_channels' in arch:
        arch = dict(arch)
        ffn = arch.pop('feedforward_channels')
        if arch.setdefault('mlp_dims', ffn) != ffn:
            raise ValueError(f'a custom arch gives both mlp_dims={arch["mlp_dims"]} and '
                             f'feedforward_channels={ffn} (the same thing); keep one.')
    if not isinstance(arch, Mapping) or not required <= set(arch):
        raise ValueError(f'a custom arch must be a dict with keys {sorted(required)} (mlp_dims may be '
                         f'given as feedforward_channels), got {arch!r}')
    unknown = set(arch) - required
    if unknown:
        raise ValueError(f'a custom arch has unknown keys {sorted(unknown)}; it takes {sorted(required)} '
                         '(mlp_dims may be given as feedforward_channels).')
    return dict(arch)
