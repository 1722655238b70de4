"""Private names of torch_xla (imported at first call); checked against torch_xla 2.9.0."""
from typing import List, Sequence

import torch

__all__ = ['sync_and_copy_to_cpu', 'sharding_spec', 'local_shards']


def _xlac():
    import torch_xla  # local: an optional dependency, imported only on the XLA path
    return torch_xla._XLAC


def sync_and_copy_to_cpu(tensors: Sequence[torch.Tensor]) -> List[torch.Tensor]:
    """CPU copies of XLA tensors, pending computations run as one graph (as ``xm.save``'s private helper)."""
    xlac = _xlac()
    tensors = list(tensors)
    xlac._xla_sync_multi(tensors, devices=[], wait=True, sync_xla_data=False)
    return list(xlac._xla_get_cpu_tensors(tensors))


def sharding_spec(tensor: torch.Tensor) -> str:
    """The XLA sharding annotation of a device tensor as text (empty when replicated); ``_XLAC`` only."""
    return _xlac()._get_xla_sharding_spec(tensor)


def local_shards(tensor: torch.Tensor) -> list:
    """``(shard, device)`` pairs this process's devices hold of a sharded tensor (``_XLAC._get_local_shards``)."""
    return list(_xlac()._get_local_shards([tensor])[0])


INHERITED: dict = {}
