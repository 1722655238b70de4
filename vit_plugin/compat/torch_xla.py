"""Private names of torch_xla that vit_plugin needs; torch_xla is imported at the first call, since
it is absent from most installations.

Checked against torch_xla 2.9.0 (the only version of the classic stack; the current stack has none).
"""
from typing import List, Sequence

import torch

__all__ = ['sync_and_copy_to_cpu', 'sharding_spec', 'local_shards']


def _xlac():
    import torch_xla  # local: an optional dependency, imported only on the XLA path
    return torch_xla._XLAC


def sync_and_copy_to_cpu(tensors: Sequence[torch.Tensor]) -> List[torch.Tensor]:
    """CPU copies of XLA tensors, their pending computations run first as one graph.

    ``xm.save`` does exactly this through the private ``xm._maybe_convert_to_cpu``, which calls
    ``_XLAC._xla_sync_multi`` and ``_XLAC._xla_get_cpu_tensors``; ``tensor.cpu()`` one at a time would
    run one graph per tensor.
    """
    xlac = _xlac()
    tensors = list(tensors)
    xlac._xla_sync_multi(tensors, devices=[], wait=True, sync_xla_data=False)
    return list(xlac._xla_get_cpu_tensors(tensors))


def sharding_spec(tensor: torch.Tensor) -> str:
    """The XLA sharding annotation of a device tensor as text (empty when replicated by default).

    ``XLAShardedTensor.sharding_spec`` reads the same ``_XLAC._get_xla_sharding_spec`` but needs the
    tensor wrapped first, which ``mark_sharding`` only does for the tensors it annotated.
    """
    return _xlac()._get_xla_sharding_spec(tensor)


def local_shards(tensor: torch.Tensor) -> list:
    """The pieces of a sharded device tensor that this process's devices hold, as ``(shard, device)``
    pairs (``XLAShardedTensor.local_shards`` reads the same ``_XLAC._get_local_shards``)."""
    return list(_xlac()._get_local_shards([tensor])[0])


INHERITED: dict = {}
