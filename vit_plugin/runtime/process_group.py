"""The process group a run joins itself, with the environment variables it needs, and its release."""
import os
from typing import Mapping, Optional

import torch


def join_gloo_group(environ: Optional[Mapping[str, str]] = None) -> bool:
    """Join the default group over Gloo once, ``environ`` set in ``os.environ`` first; whether this call joined."""
    if torch.distributed.is_initialized():
        return False
    if environ:
        os.environ.update(environ)
    torch.distributed.init_process_group(backend='gloo')
    return True


def release_process_group() -> bool:
    """Destroy the default process group, if any, once the run is over; returns whether there was one."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
        return True
    return False


__all__ = ['join_gloo_group', 'release_process_group']
