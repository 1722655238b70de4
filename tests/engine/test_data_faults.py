"""A decode fault mid-run: the run saves the checkpoint of the last completed iteration, exits 65 with the
fault, the checkpoint and the resume command, and ``--resume`` after the fix trains on exactly the
batches of the uninterrupted run.

``tools/train.py`` (1 process, in the test process) and 2 Gloo processes with a data-loader worker each
(the fault on rank 1 only: its worker meets it; the stopped run through ``tools/dist_train.sh``, the
uninterrupted run and the resume as forked ranks, helpers/warm_runs.py) train a
1-block ViT on 32 JPEGs in 4 tar shards with ``vit_plugin.IterBasedTrainLoop`` and
``vit_plugin.BlockShuffleSampler`` (8 images per iteration, so all 4 iterations lie in one epoch). One
image of the batch of iteration 4 is overwritten in its shard with bytes that are no image (same size),
then restored before the resume."""
import os.path as osp
import re
import subprocess
import tarfile

import numpy as np
import pytest
import torch

from helpers.sample_recorder import read_batches
from helpers.common import REPO, free_port, run_env
from helpers.in_process import Outcome, train_in_process
from helpers.tar_shards import make_samples, write_wds
from helpers.training_runs import dist_cmd
from helpers.warm_runs import train_ranks
from vit_plugin.engine.checkpointing import checkpoint_problem
from vit_plugin.engine.data_faults import EXIT_DATA_FAULT, TrainingDataFault

MAX_ITERS = 4
FAULT_AT = 3  # the batch (0-based) that holds the bad image; checkpoints by interval: 2 and 4
SAMPLES = 8 * MAX_ITERS  # one epoch


def write_config(path, data_root, num_workers, batch_size, recorder='sample_recorder'):
    """The run's config; ``recorder``: the module of ``BatchRecorderHook`` (``sample_recorder`` in a
    training subprocess, ``helpers.sample_recorder`` in the test process and its forks)."""
    path.write_text(f"""
_base_ = [{osp.join(REPO, 'configs', 'vit_demo_digits.py')!r}]
custom_imports = dict(imports=['vit_plugin', {recorder!r}], allow_failed_imports=False)
model = dict(backbone=dict(arch=dict(embed_dims=32, num_layers=1, num_heads=2, mlp_dims=64), drop_rate=0.1),
             head=dict(in_channels=32))
train_dataloader = dict(
    _delete_=True, batch_size={batch_size}, num_workers={num_workers}, persistent_workers=False,
    sampler=dict(type='vit_plugin.BlockShuffleSampler', seed=0, block_size=4, mix_blocks=2),
    dataset=dict(type='vit_plugin.TarShardDataset', data_root={data_root!r}, index_workers=1,
                 pipeline=[dict(type='vit_plugin.LoadImageFromFile'), dict(type='mmpretrain.Resize', scale=(32, 32)),
                           dict(type='mmpretrain.PackInputs')]))
val_dataloader = None
val_cfg = None
val_evaluator = None
test_dataloader = None
test_cfg = None
test_evaluator = None
param_scheduler = [dict(type='LinearLR', start_factor=0.1, by_epoch=False, begin=0, end={MAX_ITERS})]
train_cfg = dict(_delete_=True, type='vit_plugin.IterBasedTrainLoop', max_iters={MAX_ITERS})
default_hooks = dict(logger=dict(interval=1), checkpoint=dict(by_epoch=False, interval=2, max_keep_ckpts=5))
custom_hooks = [dict(type='BatchRecorderHook', per_rank=True)]
""")
    return str(path)


def member_range(shard, member):
    """(offset, size) of ``member``'s bytes in the tar ``shard``."""
    with tarfile.open(shard) as tf:
        info = tf.getmember(member)
        return info.offset_data, info.size


def first_draw(batches, path):
    """(iteration, rank) of the first batch holding ``path``, over ranks ``batches[rank][iteration]``."""
    return min((it, rank) for rank, per_rank in enumerate(batches) for it, batch in per_rank.items()
               if path in batch['paths'])


def fault_run(tmp_path_factory, procs, num_workers):
    """An uninterrupted run, the run stopped by the fault on the last rank and the run resumed after the
    fix: their exit status, output, work dir and each rank's batches. One process trains in the test
    process (a config file per run, so that each run's logger is its own); two stop through
    ``tools/dist_train.sh`` and run uninterrupted and resume as forked ranks (helpers/warm_runs.py)."""
    root = tmp_path_factory.mktemp(f'data_fault_{procs}')
    data = root / 'shards'
    write_wds(str(data), make_samples(SAMPLES), [SAMPLES // 4] * 4)
    configs = {name: write_config(root / f'{name}.py', str(data), num_workers, batch_size=8 // procs,
                                  recorder='sample_recorder' if (procs, name) == (2, 'stop') else
                                  'helpers.sample_recorder')
               for name in ('full', 'stop', 'resume')}

    def train(name, work, *extra, expect=0):
        if procs == 1:
            outcome = train_in_process(configs[name], work, *extra)
            assert outcome.code == expect, outcome.output[-4000:]
            if expect:  # what tools/train.py exits with: the data fault, no traceback
                assert isinstance(outcome.stop, TrainingDataFault), outcome.output[-4000:]
            return outcome
        cfg = configs[name]
        if not expect:
            outcome = train_ranks(cfg, work, *extra, procs=procs)
            assert outcome.code == 0, outcome.output[-4000:]
            return outcome
        env = dict(run_env(), PORT=str(free_port()))
        proc = subprocess.run(dist_cmd(cfg, work, *extra, procs=procs), env=env, capture_output=True, text=True,
                              timeout=300, cwd=REPO)  # torchrun reports each process's status, exits 1
        # torchrun exits 1 and names the first process's status as the root cause. Once one process has
        # exited it stops the others (-15; torch 2.9 leaves them out of its report); they are past the
        # barrier that follows the checkpoint by then (the checkpoint's checks), so each process ends with
        # 65 or, after that barrier, -15.
        codes = re.findall(r'^\s*exitcode\s+:\s*(-?\d+)', proc.stderr, flags=re.MULTILINE)  # its report
        root_cause = proc.stderr.split('Root Cause', 1)[-1]
        assert proc.returncode == 1 and f'exitcode  : {expect}' in root_cause, proc.stderr[-4000:]
        assert 1 <= len(codes) <= procs and set(codes) <= {str(expect), '-15'}, proc.stderr[-4000:]
        return Outcome(expect, None, proc.stdout + proc.stderr)  # each process's exit status

    train('full', root / 'full')
    reference = [read_batches(root / 'full', rank) for rank in range(procs)]
    bad_rank = procs - 1
    # an image the last rank draws first at FAULT_AT, and no rank before
    bad = next(p for p in reference[bad_rank][FAULT_AT]['paths'] if first_draw(reference, p) == (FAULT_AT, bad_rank))
    shard, member = bad.rsplit(':', 1)
    offset, size = member_range(shard, member)
    with open(shard, 'rb') as f:
        original = f.read()
    with open(shard, 'r+b') as f:  # the same size: only the image is bad
        f.seek(offset)
        f.write(b'\0' * size)

    work = root / 'run'
    stopped = train('stop', work, expect=EXIT_DATA_FAULT)
    stopped_batches = [read_batches(work, rank) for rank in range(procs)]
    last = (work / 'last_checkpoint').read_text()
    problem = checkpoint_problem(str(work / last))
    meta = torch.load(work / last, map_location='cpu', weights_only=False)['meta']
    with open(shard, 'wb') as f:  # the fix: the shard as it was
        f.write(original)
    resumed = train('resume', work, '--resume')
    return dict(work=work, bad=bad, bad_rank=bad_rank, reference=reference, last=last, problem=problem, meta=meta,
                stopped_code=stopped.code, stopped_output=stopped.output, stopped_batches=stopped_batches,
                resumed_output=resumed.output,
                resumed_batches=[read_batches(work, rank) for rank in range(procs)])


@pytest.fixture(scope='module')
def one_process(tmp_path_factory):
    return fault_run(tmp_path_factory, procs=1, num_workers=0)


@pytest.fixture(scope='module')
def two_processes(tmp_path_factory):
    return fault_run(tmp_path_factory, procs=2, num_workers=1)


def check_stop(found, procs):
    assert found['stopped_code'] == EXIT_DATA_FAULT
    output = found['stopped_output']
    # the message: the fault (naming the image), the checkpoint, the resume command; no stack trace
    assert 'Data fault' in output and found['bad'] in output and 'not an image' in output
    assert (f'on rank {found["bad_rank"]}' in output) == (procs > 1)
    assert f'iter_{FAULT_AT}.pth' in output and '--resume' in output
    # no stack trace (torchrun prints its own report of the failed job, through torch's code only)
    assert 'Traceback' not in output if procs == 1 else osp.join(REPO, 'vit_plugin') not in output
    # the checkpoint of the last completed iteration, written atomically and recorded as the newest
    assert found['last'] == f'iter_{FAULT_AT}.pth' and found['problem'] is None
    assert found['meta']['iter'] == FAULT_AT
    # every rank trained on the batches before the fault, none on the failing one
    for rank in range(procs):
        assert sorted(found['stopped_batches'][rank]) == list(range(FAULT_AT))


def check_resume(found, procs):
    assert f'iter_{FAULT_AT}.pth' in found['resumed_output']
    for rank in range(procs):
        reference, resumed = found['reference'][rank], found['resumed_batches'][rank]
        assert sorted(resumed) == list(range(FAULT_AT, MAX_ITERS))
        trained = {**found['stopped_batches'][rank], **resumed}
        assert [trained[i]['paths'] for i in range(MAX_ITERS)] == [reference[i]['paths'] for i in range(MAX_ITERS)]
        np.testing.assert_allclose([trained[i]['loss'] for i in range(MAX_ITERS)],
                                   [reference[i]['loss'] for i in range(MAX_ITERS)], rtol=0, atol=1e-6)


@pytest.mark.slow
def test_decode_fault_saves_the_last_completed_iteration_and_exits_65(one_process):
    check_stop(one_process, procs=1)


@pytest.mark.slow
def test_resume_after_the_fix_trains_on_the_uninterrupted_batches(one_process):
    check_resume(one_process, procs=1)


@pytest.mark.slow
def test_fault_on_one_of_two_processes_stops_both_with_one_checkpoint(two_processes):
    check_stop(two_processes, procs=2)


@pytest.mark.slow
def test_resume_of_two_processes_trains_on_the_uninterrupted_batches(two_processes):
    check_resume(two_processes, procs=2)
