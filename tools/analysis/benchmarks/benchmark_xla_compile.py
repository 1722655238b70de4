"""XLA compile time of a ViT training step, blocks unrolled against blocks in one scanned loop.

Each variant runs in a fresh process (nothing cached between them): a ViT of the chosen depth and
width, a linear classifier, AdamW; a few training steps on the XLA device. Reported per variant:
XLA's own compile-time metric (all graphs compiled, summed), the number of compilations, the wall
time of the first two steps (trace + compile + run; AdamW's first step is a graph of its own) and the
steady step time. Prints the ratios and writes JSON.

    PJRT_DEVICE=CPU python tools/analysis/benchmark_xla_compile.py                 # ViT-L/16 depth
    PJRT_DEVICE=CPU python tools/analysis/benchmark_xla_compile.py --arch h --patch-size 14
    PJRT_DEVICE=CPU python tools/analysis/benchmark_xla_compile.py --arch-dict 64 24 4 256 --img-size 64

Dropout is off in both variants (layer scan cannot draw random masks; see vit_plugin.xla.scan).
"""
import argparse
import json
import subprocess
import sys
import time

import torch
import torch.nn as nn

from benchmarks.child_process import child_env, child_failure
from benchmarks.timing import time_calls
from vit_plugin.models.backbones.vit import ViT
from vit_plugin.xla.scan import enable_layer_scan



def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--arch', default='l', help="arch_zoo name (default 'l': 24 blocks, width 1024)")
    parser.add_argument('--arch-dict', nargs=4, type=int, metavar=('WIDTH', 'DEPTH', 'HEADS', 'MLP'),
                        help='a custom arch instead of --arch')
    parser.add_argument('--img-size', type=int, default=224)
    parser.add_argument('--patch-size', type=int, default=16)
    parser.add_argument('--batch-size', type=int, default=2)
    parser.add_argument('--steps', type=int, default=5,
                        help='training steps per variant (>= 3: the first two compile, AdamW creates its '
                        'state in the first)')
    parser.add_argument('--out', help='write the results as JSON here')
    parser.add_argument('--worker', choices=['unrolled', 'scan'], help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def worker(args) -> dict:
    """Run in the child process: train ``args.steps`` steps and measure."""
    # torch_xla: an optional dependency, installed where the XLA path is used.
    import torch_xla
    import torch_xla.debug.metrics as met

    arch = args.arch
    if args.arch_dict:
        arch = dict(zip(('embed_dims', 'num_layers', 'num_heads', 'mlp_dims'), args.arch_dict))
    torch.manual_seed(0)
    backbone = ViT(arch=arch, img_size=args.img_size, patch_size=args.patch_size, drop_rate=0.)
    model = nn.ModuleDict(dict(backbone=backbone, head=nn.Linear(backbone.embed_dims, 10)))
    device = torch_xla.device()
    model.to(device).train()
    if args.worker == 'scan':
        enable_layer_scan(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    images = torch.randn(args.batch_size, 3, args.img_size, args.img_size).to(device)
    labels = torch.arange(args.batch_size).remainder(10).to(device)
    last = {}

    def step():
        optimizer.zero_grad(set_to_none=True)
        tokens = model['backbone'].forward_features(images)
        loss = nn.functional.cross_entropy(model['head'](tokens[:, 0]), labels)
        loss.backward()
        optimizer.step()
        torch_xla.sync()
        last['loss'] = loss.item()  # waits for the device

    step_times = time_calls(step, args.steps)
    loss_value = last['loss']
    compile_data = met.metric_data('CompileTime') or (0, 0, [])
    later = sorted(step_times[2:])
    steady = later[len(later) // 2]
    return dict(variant=args.worker, params=sum(p.numel() for p in model.parameters()),
                depth=len(backbone.blocks), compile_s=compile_data[1] / 1e9, compiles=compile_data[0],
                first_steps_s=step_times[0] + step_times[1], steady_step_s=steady, last_loss=loss_value)


def main(argv=None):
    args = parse_args(argv)
    if args.worker:
        print('RESULT ' + json.dumps(worker(args)))
        return
    if args.steps < 3:
        raise SystemExit('--steps must be >= 3 (the first two steps compile).')
    env = child_env()
    env.setdefault('PJRT_DEVICE', 'CPU')
    results = {}
    for variant in ('unrolled', 'scan'):
        cmd = [sys.executable, '-m', 'benchmarks.benchmark_xla_compile', *(argv if argv is not None else sys.argv[1:]),
               '--worker', variant]
        start = time.perf_counter()
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if proc.returncode:
            raise SystemExit(child_failure(f'{variant} run', proc.stderr))
        line = [x for x in proc.stdout.splitlines() if x.startswith('RESULT ')][-1]
        results[variant] = dict(json.loads(line[len('RESULT '):]), process_s=time.perf_counter() - start)
    unrolled, scan = results['unrolled'], results['scan']
    print(f"ViT depth {unrolled['depth']}, {unrolled['params'] / 1e6:.1f}M parameters, img {args.img_size}, "
          f"batch {args.batch_size}, device {env['PJRT_DEVICE']}")
    print(f"{'variant':<10}{'compile s':>11}{'compiles':>10}{'2 first steps s':>17}{'steady step s':>15}")
    for name, r in results.items():
        print(f"{name:<10}{r['compile_s']:>11.1f}{r['compiles']:>10}{r['first_steps_s']:>17.1f}{r['steady_step_s']:>15.2f}")
    print(f"scan / unrolled: compile {scan['compile_s'] / unrolled['compile_s']:.2f}x, "
          f"steady step {scan['steady_step_s'] / unrolled['steady_step_s']:.2f}x; "
          f"final losses {unrolled['last_loss']:.5f} / {scan['last_loss']:.5f}")
    if args.out:
        with open(args.out, 'w') as f:
            json.dump(dict(settings=dict(arch=args.arch_dict or args.arch, img_size=args.img_size,
                                         patch_size=args.patch_size, batch_size=args.batch_size, steps=args.steps,
                                         device=env['PJRT_DEVICE']), results=results), f, indent=1)
    return results


if __name__ == '__main__':
    main()
