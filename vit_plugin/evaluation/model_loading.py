"""Build a model from any config and load a checkpoint into it, strictly for the ViT's weights, for offline tools."""
import os.path as osp
from typing import Optional, Tuple

import torch.nn as nn
from mmengine.config import Config
from mmengine.registry import MODELS, init_default_scope
from mmengine.runner.checkpoint import CheckpointLoader
from mmengine.utils import import_modules_from_strings

from vit_plugin.checkpoint import is_checkpoint_path
from vit_plugin.checkpoint.strict_load import CheckpointMismatchError, state_dict_of
from vit_plugin.models.vit_search import WrongModelError, find_vit


def load_config(config: str, cfg_options: Optional[dict] = None) -> Config:
    """Read a config, apply ``--cfg-options``, import its ``custom_imports`` and set its default scope."""
    if not osp.isfile(config):
        raise FileNotFoundError(f'config file {config!r} does not exist')
    cfg = Config.fromfile(config)
    if cfg_options:
        cfg.merge_from_dict(cfg_options)
    if cfg.get('custom_imports'):
        import_modules_from_strings(**cfg.custom_imports)
    init_default_scope(cfg.get('default_scope', 'mmpretrain'))
    if 'model' not in cfg:
        raise WrongModelError(f'config {config!r} has no `model` section')
    return cfg


def _state_dict_of(checkpoint, filename: str) -> dict:
    try:
        return state_dict_of(checkpoint, filename)
    except CheckpointMismatchError as err:
        raise WrongModelError(str(err)) from None


def load_checkpoint_checked(model: nn.Module, filename: str, vit_prefix: str) -> dict:
    """Load ``filename`` into ``model``: every ViT weight present with its shape, others when they fit.

    Returns ``unexpected`` and ``missing`` non-ViT keys. Raises WrongModelError for missing or misshapen ViT
    weights."""
    state = _state_dict_of(CheckpointLoader.load_checkpoint(filename, map_location='cpu'), filename)
    model_state = model.state_dict()
    if vit_prefix and not any(k.startswith(vit_prefix) for k in state) and \
            any(vit_prefix + k in model_state for k in state):
        state = {vit_prefix + k: v for k, v in state.items()}
    # The grid buffer is ours only (third-party weights lack it); the position embedding may
    # legitimately have another length (the load hook resizes it).
    vit_keys = [k for k in model_state if k.startswith(vit_prefix) and not k.endswith('pos_embed_grid')]
    missing = [k for k in vit_keys if k not in state]
    mismatched = [f'{k}: checkpoint {tuple(state[k].shape)} vs model {tuple(model_state[k].shape)}'
                  for k in vit_keys
                  if k in state and not k.endswith('pos_embed') and state[k].shape != model_state[k].shape]
    if missing or mismatched:
        details = []
        if missing:
            details.append(f'{len(missing)} of its {len(vit_keys)} ViT weights are missing '
                           f'(e.g. {", ".join(missing[:3])})')
        if mismatched:
            details.append(f'{len(mismatched)} have other shapes (e.g. {"; ".join(mismatched[:3])})')
        raise WrongModelError(f'checkpoint {filename} does not fit the ViT built from the config: '
                              f'{" and ".join(details)}. It was saved from a different model; pass the config '
                              f'it was trained with (same arch, patch size and class token).')
    other = {k: v for k, v in state.items() if k not in model_state or k.startswith(vit_prefix)
             or v.shape == model_state[k].shape}
    result = model.load_state_dict(other, strict=False)
    return dict(unexpected=list(result.unexpected_keys),
                missing=[k for k in result.missing_keys if not k.startswith(vit_prefix)])


def load_model(config: str, checkpoint: Optional[str], device: str = 'cpu',
               cfg_options: Optional[dict] = None) -> Tuple[nn.Module, nn.Module, Config]:
    """``config``'s model in eval mode on ``device`` with ``checkpoint`` loaded (None: none): (model, ViT, cfg)."""
    cfg = load_config(config, cfg_options)
    model_cfg = cfg.model.copy()
    if cfg.get('data_preprocessor') is not None:
        # What mmengine's Runner does with a config's top-level preprocessor: without it the model
        # would see raw 0-255 pixels instead of the [-1, 1] it was trained on.
        model_cfg.setdefault('data_preprocessor', cfg.data_preprocessor)
    model = MODELS.build(model_cfg)
    vit, prefix = find_vit(model)
    if checkpoint is not None:
        if not is_checkpoint_path(checkpoint):
            raise FileNotFoundError(f'checkpoint file {checkpoint!r} does not exist')
        load_checkpoint_checked(model, checkpoint, prefix)
    else:
        model.init_weights()
    return model.to(device).eval(), vit, cfg
