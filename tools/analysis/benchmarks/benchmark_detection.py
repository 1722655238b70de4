"""Training-step time and peak memory of the ViT Mask R-CNN, with/without activation checkpointing,
windowed attention and ViTDet's relative position bias.

Each variant runs in its own subprocess, so its peak resident memory (``ru_maxrss``) is its own; the
table reports the peak and the growth over the resident size after the model and optimiser were
built (activations, gradients and optimiser state of a training step). A training step is mmengine's
``model.train_step``: data preprocessing, forward with losses, backward, AdamW step (layer-decay
constructor). Inputs are random images of the given size with a few random boxes and masks.

Example::

    python tools/analysis/benchmark_detection.py --arch b --img-size 512 --steps 3 --threads 2 \
        --out work_dirs/benchmark/detection_cpu.json
"""
import argparse
import json
import os
import os.path as osp
import platform
import statistics
import subprocess
import sys

import vit_plugin  # noqa: F401  (registers our components)
from benchmarks.child_process import CHECKOUT, child_env, child_failure
from benchmarks.device_checks import random_detection_batch
from benchmarks.peak_memory import max_rss_mib, rss_mib
from benchmarks.timing import time_calls

CONFIG = osp.join(CHECKOUT, 'configs', 'mask_rcnn_vit_b16_simplefpn_1x_coco.py')
VARIANTS = [  # (name, with_cp, window_size, use_rel_pos)
    ('global attention', False, 0, False),
    ('global attention + checkpointing', True, 0, False),
    ('windowed (14) attention', False, 14, False),
    ('windowed (14) attention + checkpointing', True, 14, False),
    ('windowed (14) + rel-pos bias', False, 14, True),
    ('windowed (14) + rel-pos bias + checkpointing', True, 14, True),
]  # index 4 is the config's own backbone
WIDTHS = {'ti': 192, 's': 384, 'b': 768, 'l': 1024, 'h': 1280}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--arch', default='b', choices=sorted(WIDTHS), help='ViT arch (default b)')
    parser.add_argument('--img-size', type=int, default=512, help='square input side (default 512)')
    parser.add_argument('--batch', type=int, default=1, help='images per step (default 1)')
    parser.add_argument('--steps', type=int, default=3, help='timed steps after one warm-up (default 3)')
    parser.add_argument('--threads', type=int, default=None, help='torch threads (default: torch default)')
    parser.add_argument('--out', default=None, help='also write the results as json here')
    parser.add_argument('--only', type=int, nargs='+', default=None,
                        help=f'run only these variants (indices 0-{len(VARIANTS) - 1}, see VARIANTS). Default: all.')
    parser.add_argument('--variant', type=int, default=None, help=argparse.SUPPRESS)  # internal: run one
    args = parser.parse_args(argv)
    if args.only is not None and not all(0 <= i < len(VARIANTS) for i in args.only):
        parser.error(f'--only takes variant indices 0-{len(VARIANTS) - 1}, got {args.only}')
    return args


def run_variant(args) -> dict:
    """Build one variant, time its training steps, report its memory (runs in a subprocess)."""
    import torch
    from mmengine.config import Config
    from mmengine.registry import init_default_scope

    from mmdet.registry import MODELS
    from mmengine.optim import build_optim_wrapper

    if args.threads:
        torch.set_num_threads(args.threads)
    name, with_cp, window, rel_pos = VARIANTS[args.variant]
    cfg = Config.fromfile(CONFIG)
    init_default_scope('mmdet')
    width = WIDTHS[args.arch]
    cfg.model.backbone.update(arch=args.arch, img_size=args.img_size, with_cp=with_cp, window_size=window,
                              use_rel_pos=rel_pos, init_cfg=None)
    cfg.model.neck.in_channels = width
    model = MODELS.build(cfg.model)
    model.init_weights()
    model.train()
    optim_wrapper = build_optim_wrapper(model, cfg.optim_wrapper)
    # A few random boxes of at least 16 px with box-shaped masks per image.
    data = random_detection_batch(args.batch, args.img_size, min_side=16)
    base_rss = rss_mib()
    last = {}

    def step():
        last['losses'] = model.train_step(data, optim_wrapper)

    times = time_calls(step, args.steps, warmup=1)  # the warm-up step warms up allocators and kernels
    losses = last['losses']
    peak = max_rss_mib()
    return dict(variant=name, with_cp=with_cp, window_size=window, use_rel_pos=rel_pos, step_s=statistics.median(times),
                peak_rss_mib=peak, step_mem_mib=peak - base_rss,
                loss=float(sum(v for k, v in losses.items() if 'loss' in k)), threads=torch.get_num_threads())


def main(argv=None):
    args = parse_args(argv)
    if args.variant is not None:
        print('RESULT ' + json.dumps(run_variant(args)))
        return
    results = []
    for index in (args.only if args.only is not None else range(len(VARIANTS))):
        cmd = [sys.executable, '-m', 'benchmarks.benchmark_detection', '--variant', str(index), '--arch', args.arch,
               '--img-size', str(args.img_size), '--batch', str(args.batch), '--steps', str(args.steps)]
        if args.threads:
            cmd += ['--threads', str(args.threads)]
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=CHECKOUT,
                              env=child_env())
        lines = [line for line in proc.stdout.splitlines() if line.startswith('RESULT ')]
        if proc.returncode or not lines:
            sys.exit(child_failure(f'variant {VARIANTS[index][0]!r}', proc.stderr))
        results.append(json.loads(lines[-1][len('RESULT '):]))
        r = results[-1]  # printed as it completes, so a long run that is interrupted keeps its rows
        print(f'{r["variant"]:<42} step {r["step_s"]:.2f} s, peak RSS {r["peak_rss_mib"]:.0f} MiB, '
              f'step memory {r["step_mem_mib"]:.0f} MiB', flush=True)
    print(f'\nViT-{args.arch.upper()}/16 Mask R-CNN (simple feature pyramid), {args.batch} x {args.img_size}x'
          f'{args.img_size}, CPU {platform.processor() or platform.machine()}, {results[0]["threads"]} threads\n')
    print('| variant | step time (s) | peak RSS (MiB) | step memory (MiB) |')
    print('|---|---|---|---|')
    for r in results:
        print(f'| {r["variant"]} | {r["step_s"]:.2f} | {r["peak_rss_mib"]:.0f} | {r["step_mem_mib"]:.0f} |')
    if args.out:
        os.makedirs(osp.dirname(osp.abspath(args.out)), exist_ok=True)
        with open(args.out, 'w') as f:
            json.dump(dict(arch=args.arch, img_size=args.img_size, batch=args.batch, results=results), f, indent=2)


if __name__ == '__main__':
    main()
