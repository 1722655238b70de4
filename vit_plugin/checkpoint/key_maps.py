"""The key names of other ViT implementations (timm, mmpretrain) against ours; imports nothing from the package."""
import re
from typing import Dict, Optional, Set, Tuple

import torch

_BLOCK_WEIGHTS = r'(norm1|attn\.qkv|attn\.proj|norm2|mlp\.fc1|mlp\.fc2)\.(weight|bias)|(ls1|ls2)\.gamma'
_EMBEDDING_WEIGHTS = r'patch_embed\.proj\.(weight|bias)|cls_token|pos_embed'

#: Our backbone weight keys (relative to the backbone). They equal timm's ``VisionTransformer`` keys:
#: ``norm_pre`` (CLIP's LayerNorm before the blocks), ``blocks.i.ls1/ls2.gamma`` (layer scale) and the
#: SwiGLU MLP's ``mlp.fc1/fc2`` included; ``fc_norm`` is the LayerNorm after average pooling of
#: ``out_type='avg_featmap'``.
OURS_KEY_RE = re.compile(r'^(' + _EMBEDDING_WEIGHTS + r'|(norm|norm_pre|fc_norm)\.(weight|bias)|'
                         r'blocks\.(\d+)\.(' + _BLOCK_WEIGHTS + r'))$')

#: The keys timm and we share with one meaning: ours without ``fc_norm``. timm's ``fc_norm`` follows
#: the pooling its ``global_pool`` chose (the class token or the mean), which a state dict does not say.
TIMM_KEY_RE = re.compile(r'^(' + _EMBEDDING_WEIGHTS + r'|(norm|norm_pre)\.(weight|bias)|'
                         r'blocks\.(\d+)\.(' + _BLOCK_WEIGHTS + r'))$')

#: mmpretrain ``VisionTransformer`` name -> ours, backbone-relative, as templates: ``{i}`` is the
#: block index; an entry ending in '.' renames a prefix, any other renames the whole key. The inverse
#: direction is derived from the same pairs.
MMPRETRAIN_NAMES = (
    ('patch_embed.projection.', 'patch_embed.proj.'),
    ('layers.{i}.ln1.', 'blocks.{i}.norm1.'),
    ('layers.{i}.attn.qkv.', 'blocks.{i}.attn.qkv.'),
    ('layers.{i}.attn.proj.', 'blocks.{i}.attn.proj.'),
    ('layers.{i}.attn.gamma1.weight', 'blocks.{i}.ls1.gamma'),
    ('layers.{i}.ln2.', 'blocks.{i}.norm2.'),
    ('layers.{i}.ffn.layers.0.0.', 'blocks.{i}.mlp.fc1.'),
    ('layers.{i}.ffn.layers.1.', 'blocks.{i}.mlp.fc2.'),
    ('layers.{i}.ffn.gamma2.weight', 'blocks.{i}.ls2.gamma'),
    ('pre_norm.', 'norm_pre.'),
    ('ln1.', 'norm.'),
    ('ln2.', 'fc_norm.'),
    ('cls_token', 'cls_token'),
    ('pos_embed', 'pos_embed'),
)

#: The same for the SwiGLU MLP of ``layer_cfgs=dict(ffn_type='swiglu_fused')`` (``SwiGLUFFNFused``).
MMPRETRAIN_SWIGLU_NAMES = (
    ('layers.{i}.ffn.w12.', 'blocks.{i}.mlp.fc1.'),
    ('layers.{i}.ffn.w3.', 'blocks.{i}.mlp.fc2.'),
)


def _compile(pairs) -> Tuple[Tuple[re.Pattern, str], ...]:
    table = []
    for source, target in pairs:
        pattern = re.escape(source).replace(re.escape('{i}'), r'(\d+)')
        table.append((re.compile('^' + pattern + ('' if source.endswith('.') else '$')),
                      target.replace('{i}', r'\1')))
    return tuple(table)


_FROM_MMPRETRAIN = _compile(MMPRETRAIN_NAMES + MMPRETRAIN_SWIGLU_NAMES)
_TO_MMPRETRAIN = _compile((ours, theirs) for theirs, ours in MMPRETRAIN_NAMES)
_TO_MMPRETRAIN_SWIGLU = _compile((ours, theirs) for theirs, ours in MMPRETRAIN_SWIGLU_NAMES)


def _rename(key: str, table) -> Optional[str]:
    for pattern, repl in table:
        new, n = pattern.subn(repl, key, count=1)
        if n:
            return new
    return None


def mmpretrain_to_ours_key(key: str) -> Optional[str]:
    """Our name for a backbone-relative mmpretrain ``VisionTransformer`` key (None if it has none)."""
    new = _rename(key, _FROM_MMPRETRAIN)
    return new if new is not None and OURS_KEY_RE.match(new) else None


def ours_to_mmpretrain_key(key: str, swiglu: bool = False) -> Optional[str]:
    """mmpretrain's name of our backbone-relative ``key`` (``swiglu``: a SwiGLU block's), or None."""
    if not OURS_KEY_RE.match(key):
        return None
    return (swiglu and _rename(key, _TO_MMPRETRAIN_SWIGLU)) or _rename(key, _TO_MMPRETRAIN)


def swiglu_blocks(state_dict: Dict[str, torch.Tensor], prefix: str = '') -> Set[int]:
    """Indices of the blocks whose MLP is SwiGLU (``mlp.fc1`` twice as wide as ``mlp.fc2`` takes)."""
    pattern = re.compile(re.escape(prefix) + r'blocks\.(\d+)\.mlp\.fc1\.weight$')
    found = set()
    for key, value in state_dict.items():
        match = pattern.match(key)
        fc2 = state_dict.get(f'{prefix}blocks.{match.group(1)}.mlp.fc2.weight') if match else None
        if fc2 is not None and value.shape[0] == 2 * fc2.shape[1]:
            found.add(int(match.group(1)))
    return found
