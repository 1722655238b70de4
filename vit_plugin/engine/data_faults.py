"""A read or decode fault stops a run with the checkpoint of the last completed iteration and exit status
:data:`EXIT_DATA_FAULT` (65). See docs/data.md#when-data-fails.
"""
from typing import Optional, Tuple

import torch
from mmengine.dist import all_reduce, broadcast_object_list, get_rank, get_world_size

from vit_plugin.datasets.decode import ImageDecodeError
from vit_plugin.datasets.shards import ShardReadError

#: Exit status of a run stopped by a data fault after writing its checkpoint (``EX_DATAERR`` of
#: sysexits.h: the input data was incorrect; fix it, then continue with ``--resume``).
EXIT_DATA_FAULT = 65
#: The errors of a sample that stop a run as a data fault.
DATA_FAULTS = (ShardReadError, ImageDecodeError)


class TrainingDataFault(SystemExit):
    """Raised at the end of a run stopped by a data fault; exits with :data:`EXIT_DATA_FAULT`."""

    def __init__(self, message: str):
        super().__init__(EXIT_DATA_FAULT)
        self.message = message

    def __str__(self):
        return self.message


def fault_summary(err: BaseException) -> str:
    """The first line of the error's own message, also for an error a data-loader worker re-raised."""
    text = str(err).strip()
    if text.startswith('Caught ') and 'Original Traceback' in text:
        last = text.splitlines()[-1]
        marker = f'{type(err).__name__}: '
        text = last.split(marker, 1)[1] if marker in last else last
    return (text.splitlines() or [type(err).__name__])[0]


def collective_agreement() -> bool:
    """Whether the processes can agree on a fault through the default group (Gloo, NCCL; not XLA)."""
    return torch.distributed.get_backend() in ('gloo', 'nccl')


def agree_on_data_fault(fault: Optional[BaseException]) -> Optional[Tuple[int, str]]:
    """``(rank, summary)`` of the lowest rank that met a data fault in this batch, or None; all ranks call it."""
    if get_world_size() == 1 or not collective_agreement():
        if fault is not None and get_world_size() > 1:
            raise fault  # a backend without host-side collectives (XLA): the fault ends this process
        return None if fault is None else (0, fault_summary(fault))
    rank = get_rank()
    flag = torch.tensor([0 if fault is None else get_world_size() - rank], dtype=torch.int64)
    all_reduce(flag, op='max')  # the lowest faulty rank has the largest flag
    value = int(flag.item())
    if not value:
        return None
    source = get_world_size() - value
    summary = [fault_summary(fault) if rank == source else None]
    broadcast_object_list(summary, src=source)
    return source, summary[0]


def data_fault_message(summary: str, rank: int, world_size: int, completed: int, checkpoint: Optional[str],
                       work_dir: str) -> str:
    """What the run says when a data fault stops it: the fault, the checkpoint, the resume command (3 lines)."""
    where = f' on rank {rank}' if world_size > 1 else ''
    if not completed:
        saved = 'No iteration had completed, so there is no checkpoint; the failing batch was not trained on.'
    elif checkpoint is None:
        saved = f'The run has no checkpoint hook, so iteration {completed} was not saved.'
    else:
        saved = (f'The checkpoint of iteration {completed}, the last completed one, is {checkpoint}; '
                 f'the failing batch was not trained on.')
    return (f'Data fault{where} drawing the batch of iteration {completed + 1}: {summary}\n{saved}\n'
            f'Fix the data, then continue with `tools/train.py CONFIG --work-dir {work_dir} --resume` '
            f'(exit status {EXIT_DATA_FAULT}).')


__all__ = ['DATA_FAULTS', 'EXIT_DATA_FAULT', 'TrainingDataFault', 'agree_on_data_fault', 'data_fault_message',
           'fault_summary']
