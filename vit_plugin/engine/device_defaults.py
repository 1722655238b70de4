"""What a GPU user expects without asking: fused optimizers, TF32 matmuls, pinned loader memory.

:func:`apply_device_defaults` is applied by ``vit_plugin.Runner`` (:mod:`vit_plugin.engine.runner`) to
the config, before mmengine's runner is built, in every process. Each default yields to the config: a
key the config sets is left alone, so every choice below can be overridden with ``--cfg-options``.

* **Optimizer kernels.** torch's Adam, AdamW and SGD get ``fused=True`` on CUDA: one kernel per
  parameter group instead of a dozen per tensor, no parameter-sized temporaries, and the
  non-finite guard and the fp16 scaler can skip a step on the device. Other optimizers on CUDA keep
  torch's multi-tensor (foreach) kernels, its default there. On the CPU torch's per-tensor loop stays
  (foreach kernels save launches, which a CPU does not pay for, and hold a parameter-sized
  temporary). Override: ``optim_wrapper.optimizer.fused=False`` (or ``foreach=True``).
* **TF32.** fp32 matmuls and convolutions use TensorFloat-32 tensor cores on GPUs of compute
  capability 8.0 or newer (A100, H100, L4...): about 8x the fp32 matmul rate with a 10-bit mantissa
  in the products and fp32 accumulation, which does not change how ViTs train. It matters for fp32
  training and for the fp32 parts of mixed precision. Switch it off with ``--no-tf32`` or
  ``--cfg-options env_cfg.tf32=False`` (e.g. to compare numerics with a CPU run). It is set with
  torch's long-standing settings (``torch.set_float32_matmul_precision``,
  ``torch.backends.cudnn.allow_tf32``), which Inductor reads; torch 2.9's newer ``fp32_precision``
  settings must not be mixed with them in the same process (torch then refuses to report the
  precision).
* **Pinned memory.** Data loaders without a ``pin_memory`` key pin their batches on CUDA hosts, so
  the copy to the GPU is asynchronous; ``--no-pin-memory`` turns it off.
"""
import warnings
from typing import List, Optional

import torch

#: torch optimizers with a fused implementation.
FUSED_OPTIMIZERS = ('Adam', 'AdamW', 'SGD')


def optimizer_defaults(optim_wrapper: dict, device: str) -> Optional[str]:
    """The fused kernel for torch's Adam, AdamW and SGD on CUDA, unless the config chose a kernel
    (changed in place).

    Args:
        optim_wrapper (dict): The config's ``optim_wrapper``.
        device (str): ``'cuda'``, ``'cpu'`` or ``'xla'`` (only CUDA changes anything).

    Returns:
        str or None: What was set, for the log, or None.
    """
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


def pin_memory_defaults(cfg, device: str) -> List[str]:
    """Pin the memory of the data loaders that do not say otherwise, on CUDA (changed in place)."""
    changed = []
    if device != 'cuda':
        return changed
    for name in ('train_dataloader', 'val_dataloader', 'test_dataloader'):
        loader = cfg.get(name)
        if isinstance(loader, dict) and 'pin_memory' not in loader:
            loader['pin_memory'] = True
            changed.append(name)
    return changed


def apply_device_defaults(cfg, device: str) -> List[str]:
    """The fused optimizer kernel, the TF32 policy and pinned loader memory for ``device``.

    Args:
        cfg (mmengine.Config): The run's config (changed in place).
        device (str): ``'cuda'``, ``'cpu'`` or ``'xla'``.

    Returns:
        list[str]: One sentence per default applied, for the log.
    """
    messages = []
    wrapper = cfg.get('optim_wrapper')
    if isinstance(wrapper, dict):
        chosen = optimizer_defaults(wrapper, device)
        if chosen:
            messages.append(f'optimizer: {chosen} (override with optim_wrapper.optimizer.fused=False)')
    if device == 'cuda':
        env_cfg = cfg.get('env_cfg') or {}
        messages.append(set_tf32(bool(env_cfg.get('tf32', True))))
        pinned = pin_memory_defaults(cfg, device)
        if pinned:
            messages.append(f'pin_memory=True for {", ".join(pinned)} (--no-pin-memory turns it off)')
    return messages
