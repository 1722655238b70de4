"""What a GPU user expects without asking: fused optimizers, TF32 matmuls, pinned loader memory.

:func:`plan_device_defaults` is a step of the run plan (:mod:`vit_plugin.engine.plan`), which every
entry point applies to the config before mmengine's runner is built, in every process;
:func:`apply_device_defaults` applies this step alone. Each default yields to the config: a key the
config sets is left alone, so every choice below can be overridden with ``--cfg-options``; the one
exception is pinned memory on a host without a GPU, which has no meaning there.

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
  the copy to the GPU is asynchronous; ``--no-pin-memory`` turns it off. On a host without a GPU
  (the CPU, an XLA device other than a GPU) every loader gets ``pin_memory=False``: torch pins nothing
  there and warns about a loader that asks (mmpretrain's ``tools/train.py`` asks by default).
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


def pin_memory_defaults(cfg, device: str, gpu: Optional[bool] = None) -> List[str]:
    """Pin the memory of the data loaders that do not say otherwise on CUDA; on a host without a GPU
    (``gpu`` False; default: ``device == 'cuda'``) unpin those that ask for it (changed in place).

    Returns:
        list[str]: The loaders changed.
    """
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
    """The device-defaults step of the run plan on ``edits``: the fused optimizer kernel and pinned loader
    memory for ``device`` (unpinned on hosts without a GPU).

    Args:
        edits (ConfigEdits): The working config.
        device (str): ``'cuda'``, ``'cpu'`` or ``'xla'``.
        gpu (bool): Whether the host has a GPU.
        log (callable): Called with one sentence per default applied.

    Returns:
        bool or None: The TF32 setting the run needs (on CUDA; None elsewhere), for :func:`set_tf32`.
    """
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
    """The fused optimizer kernel, the TF32 policy and pinned loader memory for ``device``: the
    device-defaults step of the run plan alone, applied to ``cfg`` (and TF32 set for this process).

    Args:
        cfg (mmengine.Config): The run's config (changed in place).
        device (str): ``'cuda'``, ``'cpu'`` or ``'xla'``.

    Returns:
        list[str]: One sentence per default applied, for the log.
    """
    messages: List[str] = []
    edits = ConfigEdits(cfg)
    tf32 = plan_device_defaults(edits, device, torch.cuda.is_available(), messages.append)
    ConfigEdits.apply(cfg, edits.changes())
    if tf32 is not None:
        messages.insert(1 if messages and messages[0].startswith('optimizer') else 0, set_tf32(tf32))
    return messages
