"""Per-iteration cost of the non-finite guard and of the pre-emption check, in real mmengine runs.

A small ViT classifier trains for ``--iters`` iterations under mmengine's ``Runner`` four times per
round: with neither hook, with the guard only (``default_hooks.nonfinite_guard``), with the
pre-emption hook only (``default_hooks.preemption``) and with both. The runs of a round follow each
other (each round starts with the next variant), so load from other processes hits all four alike; each run's time per iteration is measured
between its ``--skip``-th and last iteration (start-up, the first optimizer step and the data-loader
start are left out). The table gives the median over rounds and, per hook, the median of the
per-round differences to the run without hooks (paired, so drift between rounds cancels).

``--world-size 2`` runs every variant as two processes with Gloo on the CPU (what the pre-emption
check synchronises), started with ``torch.multiprocessing``; rank 0 reports.

Example::

    python tools/analysis/benchmark_hooks.py --rounds 7
    python tools/analysis/benchmark_hooks.py --rounds 5 --world-size 2
"""
import argparse
import functools
import logging
import os
import os.path as osp
import socket
import statistics
import sys
import tempfile
import time

import torch
import torch.multiprocessing as mp
from mmengine.hooks import Hook
from mmengine.logging import MMLogger
from mmengine.runner import Runner

import vit_plugin  # noqa: F401  (registers the hooks)
from benchmarks.results import write_result
from benchmarks.timing import paired_rounds
from benchmarks.toy_classifier import LossModel, vit_classifier
from vit_plugin.engine.optimizers import guarded_optim_wrapper_cfg

VARIANTS = ('none', 'guard', 'preemption', 'both')


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--rounds', type=int, default=7, help='rounds of the four runs (median). Default: 7.')
    parser.add_argument('--iters', type=int, default=100, help='iterations per run. Default: 100.')
    parser.add_argument('--skip', type=int, default=10, help='iterations left out at the start. Default: 10.')
    parser.add_argument('--batch', type=int, default=4, help='images per iteration and process. Default: 4.')
    parser.add_argument('--dims', type=int, default=64, help='ViT width. Default: 64.')
    parser.add_argument('--layers', type=int, default=2, help='ViT depth. Default: 2.')
    parser.add_argument('--img-size', type=int, default=16, help='image side (patch 4). Default: 16.')
    parser.add_argument('--threads', type=int, default=1, help='torch threads per process. Default: 1.')
    parser.add_argument('--world-size', type=int, default=1, help='processes (Gloo on CPU). Default: 1.')
    parser.add_argument('--out', default=None, help='also write the results as JSON here.')
    args = parser.parse_args(argv)
    if not 0 <= args.skip < args.iters - 1:
        parser.error('--skip must leave at least two timed iterations')
    return args


def _runner(args, variant: str, work_dir: str, timer):
    generator = torch.Generator().manual_seed(0)
    data = [dict(inputs=torch.randn(3, args.img_size, args.img_size, generator=generator),
                 labels=torch.randint(0, 10, (), generator=generator)) for _ in range(64)]
    hooks = dict(logger=None, checkpoint=None, param_scheduler=None, timer=None, sampler_seed=None,
                 nonfinite_guard=dict(type='vit_plugin.NonFiniteGuardHook',
                                      enabled=variant in ('guard', 'both')))
    if variant in ('preemption', 'both'):
        hooks['preemption'] = dict(type='vit_plugin.PreemptionHook')
    torch.manual_seed(0)
    distributed = args.world_size > 1
    # model_wrapper_cfg (read from cfg) applies to distributed runs only.
    return Runner(
        model=LossModel(_classifier(args)), work_dir=work_dir, launcher='pytorch' if distributed else 'none',
        train_cfg=dict(type='IterBasedTrainLoop', max_iters=args.iters),
        train_dataloader=dict(dataset=data, batch_size=args.batch, num_workers=0,
                              sampler=dict(type='InfiniteSampler', shuffle=True, seed=0),
                              collate_fn=dict(type='default_collate')),
        # The guard is the wrapper's type: guarded where the hook is on, as vit_plugin's runners build it.
        optim_wrapper=guarded_optim_wrapper_cfg(dict(optimizer=dict(type='AdamW', lr=1e-4)), hooks['nonfinite_guard']),
        cfg=dict(model_wrapper_cfg=dict(type='MMDistributedDataParallel', device_ids=None, broadcast_buffers=False)),
        default_hooks=hooks, custom_hooks=[timer], default_scope='mmengine',
        # mmengine names a runner's logger and visualizer by the second it started: runs in the same
        # second would share them (and a deleted work dir)
        experiment_name=f'hooks_{variant}_{osp.basename(work_dir)}',
        env_cfg=dict(dist_cfg=dict(backend='gloo')), log_level='WARNING')


def _classifier(args):
    return vit_classifier(args.dims, args.layers, max(1, args.dims // 64), 4 * args.dims, args.img_size, 4, 10)


class IterTimer(Hook):
    """The start time of every iteration and the end of training, inside the run: the runner's start-up
    and tear-down stay outside the time per iteration."""
    priority = 'HIGHEST'  # before every other hook of an iteration

    def __init__(self):
        self.marks = {}

    def before_train_iter(self, runner, batch_idx, data_batch=None):
        self.marks[runner.iter] = time.perf_counter()

    def after_train(self, runner):
        self.marks[runner.iter] = time.perf_counter()


def run_variant(args, variant: str) -> float:
    """Seconds per iteration of one run of ``variant`` (iterations ``skip``..end)."""
    timer = IterTimer()
    with tempfile.TemporaryDirectory() as work_dir:
        runner = _runner(args, variant, work_dir, timer)
        MMLogger.get_current_instance().setLevel(logging.WARNING)
        runner.train()
    end = max(timer.marks)
    return (timer.marks[end] - timer.marks[args.skip]) / (end - args.skip)


def run_rounds(args) -> dict:
    run_variant(args, 'both')  # untimed: the first run of a process pays for lazy initialisation
    # Each round starts with another variant, so a drift within rounds hits all alike.
    steps = {variant: functools.partial(run_variant, args, variant) for variant in VARIANTS}
    return paired_rounds(steps, args.rounds, rotate=True, own_clock=True)


def _worker(rank: int, args, port: int, queue) -> None:
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(args.world_size),
                      MASTER_ADDR='127.0.0.1', MASTER_PORT=str(port))
    torch.set_num_threads(args.threads)
    torch.distributed.init_process_group('gloo')
    times = run_rounds(args)
    if rank == 0:
        queue.put(times)
    torch.distributed.destroy_process_group()


def summarise(times: dict) -> dict:
    base = times['none']
    rows = {}
    for variant in VARIANTS:
        row = dict(ms_per_iter=1e3 * statistics.median(times[variant]), times_s=times[variant])
        if variant != 'none':
            diffs = [1e3 * (t - b) for t, b in zip(times[variant], base)]
            row.update(extra_ms=statistics.median(diffs), extra_ms_rounds=diffs)
        rows[variant] = row
    return rows


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.world_size > 1:
        with socket.socket() as s:
            s.bind(('127.0.0.1', 0))
            port = s.getsockname()[1]
        ctx = mp.get_context('spawn')
        queue = ctx.SimpleQueue()
        mp.start_processes(_worker, args=(args, port, queue), nprocs=args.world_size, start_method='spawn')
        times = queue.get()
    else:
        torch.set_num_threads(args.threads)
        times = run_rounds(args)
    rows = summarise(times)
    print(f'torch {torch.__version__}, {args.world_size} process(es) x {args.threads} thread(s), ViT '
          f'{args.layers}x{args.dims} at {args.img_size} px, batch {args.batch}, {args.rounds} rounds of '
          f'{args.iters} iterations (first {args.skip} left out)')
    print(f"{'hooks':<12}{'ms/iter':>10}{'extra ms/iter (paired median)':>32}")
    for variant, row in rows.items():
        extra = f"{row['extra_ms']:+.3f}" if 'extra_ms' in row else ''
        print(f"{variant:<12}{row['ms_per_iter']:>10.2f}{extra:>32}")
    result = dict(argv=sys.argv[1:] if argv is None else argv, torch=torch.__version__,
                  world_size=args.world_size, rows=rows)
    if args.out:
        write_result(result, args.out)
    return result


if __name__ == '__main__':
    main()
