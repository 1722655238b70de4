"""The global gradient norm, checked by ``vit_plugin.NonFiniteGuardHook`` and ``vit_plugin.XLAOptimWrapper``."""
from typing import List, Optional

import torch


def global_grad_norm(grads: List[torch.Tensor]) -> Optional[torch.Tensor]:
    """The 2-norm of all gradients together (fp32), or None without gradients."""
    if not grads:
        return None
    norms = torch._foreach_norm(grads)  # one fused kernel per device/dtype group
    total = torch.linalg.vector_norm(torch.stack([n.float() for n in norms]))
    if hasattr(total, 'full_tensor'):  # FSDP2 DTensor shards: combine the processes' partial norms
        total = total.full_tensor()
    return total
