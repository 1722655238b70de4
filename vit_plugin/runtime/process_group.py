"""The process group a run joins itself, with the environment variables it needs, and its release."""
import os
from typing import Mapping, Optional

import torch


def join_gloo_group(environ: Optional[Mapping[str, str]] = None) -> bool:
    """Join this process's default process group over Gloo, once.

    Args:
        environ (mapping, optional): Variables the rendezvous reads (``MASTER_ADDR``, ``RANK``, ...),
            set in ``os.environ`` first (a SLURM launch derives them from ``SLURM_*``). Defaults to None.

    Returns:
        bool: Whether this call joined the group (False: it was joined already).
    """
    if torch.distributed.is_initialized():
        return False
    if environ:
        os.environ.update(environ)
    torch.distributed.init_process_group(backend='gloo')
    return True


def release_process_group() -> bool:
    """Destroy the default process group, if this process has one; returns whether it had one.

    Only once a run is over, where every process ends at the same point: a group destroyed while another
    process still waits in a collective would fail that one.
    """
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
        return True
    return False


__all__ = ['join_gloo_group', 'release_process_group']
