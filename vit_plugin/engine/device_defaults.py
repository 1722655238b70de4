"""Device defaults: fused optimizers, TF32 and pinned loaders on GPUs, unpinned loaders elsewhere.

See docs/configs.md#training-and-testing ("GPU defaults").
"""
import warnings
from typing import Callable, List, Optional

import torch

from .config_edits import ConfigEdits

#: The data loaders of a config.
LOADERS = ('train_dataloader', 'val_dataloader', 'test_dataloader')

#: torch optimizers with a fused implementation.
FUSED_OPTIMIZERS = ('Adam', 'AdamW', 'SGD')


def optimizer_defaults(optim_wrapper: dict, device: str) -> Optional[str]:
    """Set ``fused=True`` for Adam, AdamW, SGD on CUDA unless a kernel is chosen (in place); what was set, or None."""
    optimizer = (optim_wrapper or {}).get('optimizer')
    if not isinstance(optimizer, dict) or device != 'cuda':
        return None
    name = str(optimizer.get('type', '')).split('.')[-1]
    if name not in FUSED_OPTIMIZERS or any(k in optimizer for k in ('fused', 'foreach', 'capturable',
                                                                    'differentiable')):
        return None
    optimizer['fused'] = True
    return f'{name}(fused=True)'


def set_tf32(enabled: bool) -> str:
    """Allow (or forbid) TF32 for fp32 matmuls and cuDNN convolutions; returns a sentence for the log."""
    with warnings.catch_warnings():
        # torch 2.9 points to its newer settings; these are the ones Inductor reads.
        warnings.filterwarnings('ignore', message='.*new API settings to control TF32.*')
        torch.set_float32_matmul_precision('high' if enabled else 'highest')
    torch.backends.cudnn.allow_tf32 = enabled
    if not enabled:
        return 'TF32 off: fp32 matmuls and convolutions in full fp32 (env_cfg.tf32=False)'
    if torch.cuda.is_available() and torch.cuda.get_device_capability() < (8, 0):
        return 'TF32 allowed, but this GPU has no TF32 tensor cores (compute capability < 8.0)'
    return 'TF32 on for fp32 matmuls and convolutions (switch off: --no-tf32 or env_cfg.tf32=False)'


def pin_memory_defaults(cfg, device: str, gpu: Optional[bool] = None) -> List[str]:
    """Pin unset loaders on CUDA, unpin all without a GPU (in place); returns the loaders changed."""
    edits = ConfigEdits(cfg)
    changed = _plan_pin_memory(edits, device, device == 'cuda' if gpu is None else gpu)
    ConfigEdits.apply(cfg, edits.changes())
    return changed


def _plan_pin_memory(edits: ConfigEdits, device: str, gpu: bool) -> List[str]:
    changed, gpu = [], gpu or device == 'cuda'
    for name in LOADERS:
        loader = edits.get(name)
        if not isinstance(loader, dict):
            continue
        if device == 'cuda' and 'pin_memory' not in loader:
            edits.set((name, 'pin_memory'), True)
            changed.append(name)
        elif not gpu and loader.get('pin_memory'):
            edits.set((name, 'pin_memory'), False)
            changed.append(name)
    return changed


def plan_device_defaults(edits: ConfigEdits, device: str, gpu: bool, log: Callable[[str], None]) -> Optional[bool]:
    """The device-defaults plan step on ``edits``; returns the TF32 setting for CUDA, else None."""
    wrapper = edits.get('optim_wrapper')
    if isinstance(wrapper, dict) and isinstance(wrapper.get('optimizer'), dict):
        optimizer = dict(wrapper['optimizer'])
        chosen = optimizer_defaults(dict(optimizer=optimizer), device)
        if chosen:
            edits.set('optim_wrapper.optimizer.fused', True)
            log(f'optimizer: {chosen} (override with optim_wrapper.optimizer.fused=False)')
    pinned = _plan_pin_memory(edits, device, gpu)
    if pinned and device == 'cuda':
        log(f'pin_memory=True for {", ".join(pinned)} (--no-pin-memory turns it off)')
    elif pinned:
        log(f'pin_memory=False for {", ".join(pinned)} (no GPU on this host)')
    if device != 'cuda':
        return None
    return bool((edits.get('env_cfg') or {}).get('tf32', True))


def apply_device_defaults(cfg, device: str) -> List[str]:
    """Apply the device defaults to ``cfg`` (in place) and TF32 to this process; returns log sentences."""
    messages: List[str] = []
    edits = ConfigEdits(cfg)
    tf32 = plan_device_defaults(edits, device, torch.cuda.is_available(), messages.append)
    ConfigEdits.apply(cfg, edits.changes())
    if tf32 is not None:
        messages.insert(1 if messages and messages[0].startswith('optimizer') else 0, set_tf32(tf32))
    return messages
