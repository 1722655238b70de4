"""SPMD on XLA: one process per host, batch and parameters split over one ``'fsdp'`` mesh axis.

See docs/scaling.md#spmd-one-process-per-host-batch-and-weights-split-over-a-device-mesh.
"""
from typing import Dict, Optional, Sequence, Tuple

import numpy as np
import torch
import torch.nn as nn

from . import runtime

from vit_plugin.compat import torch_xla as torch_xla_compat

#: The mesh axis that both the batch and the parameters are split over.
AXIS = 'fsdp'


def enable() -> None:
    """Switch torch_xla to SPMD mode. Must run before anything in the process uses an XLA device."""
    runtime.require('torch_xla.runtime').use_spmd()


def is_enabled() -> bool:
    return bool(runtime.require('torch_xla.runtime').is_spmd())


def build_mesh(num_devices: Optional[int] = None):
    """A 1-D mesh over all devices of the host (or the first ``num_devices``), axis :data:`AXIS`."""
    xr = runtime.require('torch_xla.runtime')
    xs = runtime.require('torch_xla.distributed.spmd')
    n = num_devices or xr.global_runtime_device_count()
    return xs.Mesh(np.arange(n), (n, ), (AXIS, ))


def param_partition_spec(shape: Sequence[int], num_shards: int) -> Optional[Tuple[Optional[str], ...]]:
    """The split of one parameter over ``num_shards``: its largest evenly divisible dim (ties: the first).

    Examples:
        >>> param_partition_spec((1, 197, 768), 4)
        (None, None, 'fsdp')
        >>> param_partition_spec((3,), 4) is None  # replicated
        True
    """
    if num_shards <= 1:
        return None
    candidates = [d for d in range(len(shape)) if shape[d] >= num_shards and shape[d] % num_shards == 0]
    if not candidates:
        return None
    dim = max(candidates, key=lambda d: (shape[d], -d))
    spec = [None] * len(shape)
    spec[dim] = AXIS
    return tuple(spec)


def shard_parameters(model: nn.Module, mesh) -> Dict[str, Optional[tuple]]:
    """Annotate each parameter of ``model`` (on the device) with its split; name -> spec (None: replicated)."""
    xs = runtime.require('torch_xla.distributed.spmd')
    specs = {}
    for name, param in model.named_parameters():
        spec = param_partition_spec(tuple(param.shape), int(mesh.size()))
        if spec is not None:
            xs.mark_sharding(param, mesh, spec)
        specs[name] = spec
    return specs


def shard_batch(tensor: torch.Tensor, mesh) -> torch.Tensor:
    """Split a batch tensor's first dimension over the mesh (in place; returns ``tensor``)."""
    n = int(mesh.size())
    if tensor.shape[0] % n:
        raise ValueError(f'XLA SPMD: a batch of {tensor.shape[0]} does not split over {n} devices. '
                         f'Make train_dataloader.batch_size a multiple of {n} (global batch: SPMD runs '
                         'one process for all devices of the host).')
    runtime.require('torch_xla.distributed.spmd').mark_sharding(tensor, mesh, (AXIS, ) + (None, ) *
                                                                (tensor.dim() - 1))
    return tensor


def shard_preprocessed_batches(model: nn.Module, mesh):
    """Split the data preprocessor's stacked ``inputs`` over the mesh (a forward hook; returns its handle)."""
    preprocessor = getattr(model, 'data_preprocessor', None)
    if preprocessor is None:
        raise TypeError(f'XLA SPMD needs an mmengine model with a data_preprocessor; {type(model).__name__} '
                        'has none.')

    def hook(module, args, output):
        inputs = output.get('inputs') if isinstance(output, dict) else None
        for tensor in (inputs if isinstance(inputs, (list, tuple)) else [inputs]):
            if isinstance(tensor, torch.Tensor) and tensor.dim() >= 1:
                shard_batch(tensor, mesh)
        return output

    return preprocessor.register_forward_hook(hook)


def sharding_of(tensor: torch.Tensor) -> str:
    """The XLA sharding annotation of a device tensor as text (empty when replicated by default)."""
    runtime.require()
    return torch_xla_compat.sharding_spec(tensor)


def shard_shape(tensor: torch.Tensor) -> Tuple[int, ...]:
    """The shape of the piece of ``tensor`` that each device holds."""
    runtime.require()
    shards = torch_xla_compat.local_shards(tensor)
    return tuple(shards[0][0].shape) if shards else tuple(tensor.shape)
