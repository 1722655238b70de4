"""A read or decode fault that stops a run leaves the checkpoint of the last completed iteration.

A sample that cannot be read (:class:`~vit_plugin.datasets.shards.ShardReadError`, e.g.
``SampleReadError`` after the retries) or decoded (:class:`~vit_plugin.datasets.decode.ImageDecodeError`
without ``vit_plugin.SkipBadSamples``) surfaces in the training loop when it draws the batch
(data-loader workers re-raise it in the training process). ``vit_plugin.IterBasedTrainLoop`` then stops
before training on that batch: the processes of a multi-process run agree on the fault (one all-reduce
of a flag per iteration, so no process waits in a collective for one that failed), the checkpoint of
the last completed iteration is written through the run's checkpoint hook as on pre-emption
(:func:`~vit_plugin.engine.preemption.save_iteration_checkpoint`), the ``after_train`` hooks run, and
:class:`TrainingDataFault` ends the process with :data:`EXIT_DATA_FAULT` (65). The failing batch was not
trained on, so ``--resume`` after the fix trains on exactly the batches of an uninterrupted run.
See docs/data.md#when-data-fails.
"""
from typing import Optional, Tuple

import torch
from mmengine.dist import all_reduce, broadcast_object_list, get_rank, get_world_size

from vit_plugin.datasets.decode import ImageDecodeError
from vit_plugin.datasets.shards.errors import ShardReadError

#: Exit status of a run stopped by a data fault after writing its checkpoint (``EX_DATAERR`` of
#: sysexits.h: the input data was incorrect; fix it, then continue with ``--resume``).
EXIT_DATA_FAULT = 65
#: The errors of a sample that stop a run as a data fault.
DATA_FAULTS = (ShardReadError, ImageDecodeError)


class TrainingDataFault(SystemExit):
    """Raised at the end of a run stopped by a data fault; exits the interpreter with
    :data:`EXIT_DATA_FAULT`. ``message`` says what failed, the checkpoint and the resume command."""

    def __init__(self, message: str):
        super().__init__(EXIT_DATA_FAULT)
        self.message = message

    def __str__(self):
        return self.message


def fault_summary(err: BaseException) -> str:
    """The first line of the error's own message (which names the file or shard and what to do), also
    for an error a data-loader worker re-raised (``Caught X in DataLoader worker process N. ...``)."""
    text = str(err).strip()
    if text.startswith('Caught ') and 'Original Traceback' in text:
        last = text.splitlines()[-1]
        marker = f'{type(err).__name__}: '
        text = last.split(marker, 1)[1] if marker in last else last
    return (text.splitlines() or [type(err).__name__])[0]


def collective_agreement() -> bool:
    """Whether the processes can agree on a fault through the default group: gloo and NCCL (mmengine
    moves the flag to the group's device). Under XLA's group a per-iteration host read would cut the
    traced step, so a fault there raises in the process that met it, without a checkpoint."""
    return torch.distributed.get_backend() in ('gloo', 'nccl')


def agree_on_data_fault(fault: Optional[BaseException]) -> Optional[Tuple[int, str]]:
    """Whether any process met a data fault drawing this batch: ``(rank, summary)`` of the lowest rank
    that did, on every process, or None. A multi-process run all-reduces a flag (every process calls
    this once per batch) and, only on a fault, broadcasts its summary."""
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
    """What the run says when a data fault stops it: the fault, the checkpoint, the resume command (3
    lines)."""
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
