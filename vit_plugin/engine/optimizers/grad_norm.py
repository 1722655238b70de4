"""The global gradient norm, checked by the guarded optimizer wrappers (``vit_plugin.GuardedOptimWrapper``, ...)."""
from typing import List, Optional

import torch

from vit_plugin.compat import torch as torch_compat


def global_grad_norm(grads: List[torch.Tensor]) -> Optional[torch.Tensor]:
    """The 2-norm of all gradients together (fp32), or None without gradients."""
    total = torch_compat.global_grad_norm(grads)
    if total is None:
        return None
    if hasattr(total, 'full_tensor'):  # FSDP2 DTensor shards: combine the processes' partial norms
        total = total.full_tensor()
    return total
