"""Checkpoint converters (pure functions) and the loaders that let configs read official ``.npz``,
``transformers`` and timm hub checkpoints directly (docs/checkpoints.md#every-loading-path)."""
from ..checkpoint import register_checkpoint_format, register_state_dict_adapter
from .common import BACKBONE_PREFIX, HEAD_PREFIX, ConversionError, ConversionReport
from .jax_npz import convert_jax_vit, inspect_jax_vit, load_official_npz, read_npz
from .torch_formats import (detect_torch_format, mmpretrain_mim_to_vit, mmpretrain_to_vit, timm_to_vit,
                            vit_to_mmpretrain, vit_to_timm)
from .finetune_head import finetune_transfer
from .timm_hub import adapt_timm_checkpoint, read_timm_config
from .transformers_vit import (adapt_transformers_checkpoint, is_transformers_vit, read_transformers_config,
                               transformers_to_vit, vit_to_transformers)

register_checkpoint_format('.npz', load_official_npz)
register_state_dict_adapter(adapt_transformers_checkpoint)
register_state_dict_adapter(adapt_timm_checkpoint)

__all__ = ['BACKBONE_PREFIX', 'HEAD_PREFIX', 'ConversionError', 'ConversionReport', 'convert_jax_vit',
           'adapt_timm_checkpoint', 'adapt_transformers_checkpoint', 'is_transformers_vit', 'read_timm_config',
           'read_transformers_config', 'transformers_to_vit', 'vit_to_transformers',
           'detect_torch_format', 'finetune_transfer', 'inspect_jax_vit', 'load_official_npz',
           'mmpretrain_mim_to_vit', 'mmpretrain_to_vit', 'read_npz', 'timm_to_vit', 'vit_to_mmpretrain', 'vit_to_timm']
