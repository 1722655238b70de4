"""Time from ``runner.train()`` to the first trained iteration of a run resumed at a deep iteration:
mmengine's ``IterBasedTrainLoop`` with its ``InfiniteSampler`` against ``vit_plugin.IterBasedTrainLoop``
with ``vit_plugin.BlockShuffleSampler``.

The data are the ImageNet-like JPEGs of :mod:`.benchmark_shards` in timm's shard layout, read by
``vit_plugin.TarShardDataset`` through the imagenet21k config's pipeline (Inception crop to 224 + flip),
``--batch`` samples per iteration, ``--workers`` data-loader workers; the model is a one-block ViT
(32 wide, patch 16) so that the time is the data path's. A checkpoint at iteration ``--resume-at`` is
written once (a run of one iteration, saved with ``meta.iter = --resume-at``), then every round times,
in turns, each in a new ``Runner`` in this process:

* ``fresh``: no resume (``vit_plugin.IterBasedTrainLoop`` from iteration 0): the start-up floor;
* ``before``: mmengine's ``IterBasedTrainLoop`` + ``InfiniteSampler(shuffle=True)``, ``resume=True``. On
  mmengine 0.10.7 (the classic stack) the loop draws every finished batch again from the data loader;
  onedl-mmengine 0.10.12 (the current stack) asks ``InfiniteSampler.skip`` instead;
* ``after``: ``vit_plugin.IterBasedTrainLoop`` + ``vit_plugin.BlockShuffleSampler``, ``resume=True``.

Each is the time from ``runner.train()`` (data loader, workers, checkpoint loading and the skip
included) to the end of the first trained iteration. The cost of a skipped batch is
``(before - fresh) / --resume-at`` (median of per-round values); the report extrapolates it to
iteration 100,000 of the same run, which is an extrapolation, not a measurement.

Example (docs/benchmarks.md#resume; once per stack)::

    python tools/analysis/benchmark_resume.py --out work_dirs/benchmark/resume.json
"""
import argparse
import gc
import logging
import os
import os.path as osp
import platform
import statistics
import tempfile
import time
from typing import Dict, List, Optional

from benchmarks.benchmark_shards import PIPELINE, SPLIT, add_image_args, write_images
from benchmarks.results import write_result
from benchmarks.timing import paired_rounds

VARIANTS = ('fresh', 'before', 'after')
EXTRAPOLATE_TO = 100_000


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    add_image_args(parser, 8192)  # benchmark_shards' images: the same folder serves both
    parser.add_argument('--resume-at', type=int, default=2000, help='the checkpoint\'s iteration. Default: 2000.')
    parser.add_argument('--batch', type=int, default=32, help='samples per iteration. Default: 32.')
    parser.add_argument('--workers', type=int, default=2, help='data-loader workers. Default: 2.')
    parser.add_argument('--rounds', type=int, default=3, help='rounds of the three runs (median). Default: 3.')
    parser.add_argument('--variants', nargs='+', default=list(VARIANTS), choices=VARIANTS)
    parser.add_argument('--out', default=None, help='write the results as JSON here.')
    args = parser.parse_args(argv)
    if args.resume_at < 1:
        parser.error('--resume-at must be at least 1')
    return args


def _first_iteration_hook():
    from mmengine.hooks import Hook

    class FirstIteration(Hook):
        """Notes the time at the end of the first trained iteration, and its index (0-based)."""
        priority = 'LOWEST'

        def __init__(self):
            self.at: Optional[float] = None
            self.iteration: Optional[int] = None

        def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None):
            if self.at is None:
                self.at, self.iteration = time.perf_counter(), batch_idx

    return FirstIteration()


def build_runner(args, shards: str, work_dir: str, name: str, variant: str, max_iters: int,
                 checkpoint: Optional[str] = None, hooks=()):
    """A ``Runner`` of the tiny ViT on the shards: mmengine's loop and sampler for ``'before'``, else
    vit_plugin's; resumed from ``checkpoint`` when given."""
    from mmengine.runner import Runner

    classes = args.num_classes
    if variant == 'before':
        loop, sampler = 'IterBasedTrainLoop', dict(type='InfiniteSampler', shuffle=True, seed=args.seed)
    else:
        loop = 'vit_plugin.IterBasedTrainLoop'
        sampler = dict(type='vit_plugin.BlockShuffleSampler', seed=args.seed, block_size=256, mix_blocks=16)
    model = dict(
        type='ImageClassifier',
        backbone=dict(type='vit_plugin.ViT', arch=dict(embed_dims=32, num_layers=1, num_heads=2, mlp_dims=64),
                      img_size=224, patch_size=16),
        neck=None,
        head=dict(type='VisionTransformerClsHead', num_classes=classes, in_channels=32,
                  loss=dict(type='CrossEntropyLoss', loss_weight=1.0)),
        data_preprocessor=dict(num_classes=classes, mean=[127.5] * 3, std=[127.5] * 3, to_rgb=True))
    return Runner(
        model=model, work_dir=work_dir, experiment_name=name, default_scope='mmpretrain',
        train_dataloader=dict(
            batch_size=args.batch, num_workers=args.workers, persistent_workers=False, sampler=sampler,
            dataset=dict(type='vit_plugin.TarShardDataset', data_root=shards, split=SPLIT, label=dict(source='cls'),
                         num_classes=classes, pipeline=[dict(t) for t in PIPELINE])),
        optim_wrapper=dict(optimizer=dict(type='AdamW', lr=1e-4)),
        train_cfg=dict(type=loop, max_iters=max_iters),
        default_hooks=dict(checkpoint=None, logger=dict(type='LoggerHook', interval=10_000)),
        custom_hooks=list(hooks), randomness=dict(seed=args.seed), log_level='WARNING',
        resume=checkpoint is not None, load_from=checkpoint)


def _end_workers(runner) -> None:
    """Stop the run's data-loader workers now: dropping the loop's iterator frees the loader's iterator at
    once, which stops its workers. (Left to the garbage collector, as the runner and its loop refer to each
    other, each worker was seen to outlive the loader's 5-second join timeout and be killed.)"""
    runner.train_loop.dataloader_iterator = None
    gc.collect()


def write_checkpoint(args, shards: str, work: str) -> str:
    """A checkpoint of the tiny ViT that says iteration ``--resume-at`` (one iteration trained, saved with
    that count: what resuming reads is the count, the model and optimizer states)."""
    runner = build_runner(args, shards, osp.join(work, 'prepare'), 'prepare', 'after', 1)
    runner.train()
    runner.save_checkpoint(runner.work_dir, f'iter_{args.resume_at}.pth', meta=dict(epoch=0, iter=args.resume_at),
                           save_optimizer=True, save_param_scheduler=True, by_epoch=False)
    path = osp.join(runner.work_dir, f'iter_{args.resume_at}.pth')
    _end_workers(runner)
    return path


def measure(args, shards: str, work: str) -> Dict[str, object]:
    """Rounds of the variants: seconds from ``runner.train()`` to the first trained iteration, and what each
    run was (loop, sampler, first iteration)."""
    import torch
    torch.set_num_threads(1)
    checkpoint = write_checkpoint(args, shards, work)
    runs: Dict[str, List[dict]] = {v: [] for v in args.variants}

    def step(variant: str):
        def run() -> float:
            hook = _first_iteration_hook()
            resumed = variant != 'fresh'
            name = f'{variant}_{len(runs[variant])}'
            runner = build_runner(args, shards, osp.join(work, name), name, variant,
                                  args.resume_at + 1 if resumed else 1, checkpoint if resumed else None, [hook])
            start = time.perf_counter()
            runner.train()
            seconds = hook.at - start
            sampler = runner.train_dataloader.sampler
            runs[variant].append(dict(seconds=seconds, first_iteration=hook.iteration,
                                      loop=f'{type(runner.train_loop).__module__}.{type(runner.train_loop).__name__}',
                                      sampler=f'{type(sampler).__module__}.{type(sampler).__name__}'))
            _end_workers(runner)
            return seconds
        return run

    times = paired_rounds({v: step(v) for v in args.variants}, args.rounds, own_clock=True, rotate=True)
    return dict(times=times, runs=runs)


def summarise(times: Dict[str, List[float]], resume_at: int) -> dict:
    """Medians, and the per-batch cost of skipping (paired against ``fresh`` per round) with its
    extrapolation to iteration 100,000."""
    rows = {name: dict(seconds=statistics.median(ts), min=min(ts), max=max(ts), times_s=ts)
            for name, ts in times.items()}
    if 'fresh' in times:
        for name in ('before', 'after'):
            if name in times:
                per_batch = statistics.median((t - f) / resume_at for t, f in zip(times[name], times['fresh']))
                rows[name].update(skip_s_per_batch=per_batch, extrapolated_s=per_batch * EXTRAPOLATE_TO)
    return rows


def _duration(seconds: float) -> str:
    if abs(seconds) < 120:
        return f'{seconds:.1f} s'
    if abs(seconds) < 2 * 3600:
        return f'{seconds / 60:.0f} min'
    return f'{seconds / 3600:.1f} h'


def table(rows: dict, runs: Dict[str, List[dict]], resume_at: int) -> str:
    head = ('run', 'loop + sampler', 'to first iteration (median; min-max)', 'per skipped batch',
            f'at iteration {EXTRAPOLATE_TO:,} (extrapolated)')
    lines = ['| ' + ' | '.join(head) + ' |', '|' + '---|' * len(head)]
    for name, r in rows.items():
        loop, sampler = runs[name][0]['loop'], runs[name][0]['sampler']
        what = (f"{loop.rsplit('.', 1)[-1]} ({loop.split('.')[0]}) + "
                f"{sampler.split('.')[0]}.{sampler.rsplit('.', 1)[-1]}")
        start = 'iteration 0' if name == 'fresh' else f'resumed at {resume_at:,}'
        per = f"{r['skip_s_per_batch'] * 1e3:.2f} ms" if 'skip_s_per_batch' in r else '-'
        extra = _duration(r['extrapolated_s']) if 'extrapolated_s' in r else '-'
        lines.append(f"| {name}, {start} | {what} | {r['seconds']:.2f} s ({r['min']:.2f}-{r['max']:.2f}) | {per} "
                     f"| {extra} |")
    return '\n'.join(lines)


def main(argv=None) -> dict:
    import mmengine
    import torch

    args = parse_args(argv)
    started = time.perf_counter()
    os.makedirs(args.data_dir, exist_ok=True)
    data = write_images(args.data_dir, args.num_images, args.long_side, args.quality, args.num_classes,
                        args.shard_size, args.seed)
    logging.getLogger('mmengine').setLevel(logging.WARNING)
    with tempfile.TemporaryDirectory(prefix='resume_bench_', dir=args.data_dir) as work:
        measured = measure(args, data.shards, work)
    rows = summarise(measured['times'], args.resume_at)
    result = dict(setting=dict(num_images=args.num_images, mean_file_kib=round(data.mean_kib, 1),
                               resume_at=args.resume_at, batch=args.batch, workers=args.workers, rounds=args.rounds,
                               mmengine=mmengine.__version__, torch=torch.__version__, cpu_count=os.cpu_count(),
                               python=platform.python_version()),
                  rows=rows, runs=measured['runs'])
    print(f'\nmmengine {mmengine.__version__}, torch {torch.__version__}: resume at iteration {args.resume_at:,}, '
          f'batch {args.batch}, {args.workers} workers, {args.num_images} JPEGs ({data.mean_kib:.0f} KiB), '
          f'median of {args.rounds} rounds; per skipped batch = (run - fresh) / {args.resume_at}, paired by round')
    print(table(rows, measured['runs'], args.resume_at))
    result['seconds'] = time.perf_counter() - started
    print(f'{result["seconds"]:.0f} s in all')
    if args.out:
        write_result(result, args.out)
        print(f'written {args.out}')
    return result
