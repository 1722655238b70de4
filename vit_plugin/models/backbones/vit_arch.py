"""The ViT architectures by name and the parsing of ``arch``; imports neither the package nor torch.

See docs/backbone.md#archs."""
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
    """The sizes ``arch`` names: a key of ``table`` (any case), or a dict of ``embed_dims``, ``num_layers``,
    ``num_heads`` and ``mlp_dims`` (or ``feedforward_channels``).

    Raises:
        KeyError: An unknown name.
        ValueError: A dict with missing, unknown or contradictory keys.
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
