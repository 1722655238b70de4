"""Throughput and peak memory of vit_plugin's ViT against timm's and mmpretrain's, in one process.

For every requested arch the three models are built with identical shapes (a ViT backbone plus a
linear classifier on the class token), then timed in turns: each repeat runs every model once
(inference, then a training step: forward + cross-entropy + backward + AdamW step) so that load from
other processes hits all of them alike, and the median over repeats is reported. "vs best peer" is
the median of the per-round ratios to the faster peer (paired, so drift between rounds cancels).
Two references are timed in the same rounds, and each model's achieved GFLOP/s (analytic FLOPs of
the architecture / time) is given as a fraction of both, again as the median of per-round ratios:
the machine's matmul peak (a square 2048 matmul in the run's dtype, read just before and just after
each model's timing, since this VM's speed changes within seconds) and, for fp32 inference, the
"GEMM ceiling": the model's own matrix products alone (dense layers and attention matmuls with their
real shapes, back to back), i.e. what the model would reach if everything else (norms, GELU,
softmax, residuals, layouts) were free. On CPUs with AVX512-BF16 (or AMX-BF16) bf16 autocast
inference is reported as well. ``--compile`` times every model through ``torch.compile``;
``--freeze`` (inference) through ``torch.compile`` with Inductor freezing (pre-packed weights,
:mod:`vit_plugin.deploy`), PyTorch's own route to fast CPU inference.

Example::

    python tools/analysis/benchmark.py --arch s b --batch 8 --img-size 224 --threads 2 \
        --out work_dirs/benchmark/vit_cpu.json
"""
import argparse
import json
import os
import platform
import statistics
import sys
import time
from typing import Callable, Dict, List, Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from vit_plugin.analysis.complexity import vit_flops
from vit_plugin.deploy import compile_for_inference
from vit_plugin.models.backbones import ViT

MODELS = ('ours', 'timm', 'mmpretrain')


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--arch', nargs='+', default=['s', 'b'], choices=sorted(ViT.arch_zoo),
                        help="names of ViT.arch_zoo (the paper's Table 1 plus Ti and S). Default: s b.")
    parser.add_argument('--patch-size', type=int, default=16)
    parser.add_argument('--img-size', type=int, default=224)
    parser.add_argument('--batch', type=int, default=8)
    parser.add_argument('--num-classes', type=int, default=1000)
    parser.add_argument('--dtype', default='fp32', choices=['fp32', 'bf16'],
                        help='fp32, or bf16 autocast for every timed run. Default: fp32.')
    parser.add_argument('--threads', type=int, default=2, help='torch intra-op threads. Default: 2.')
    parser.add_argument('--repeats', type=int, default=5, help='timed rounds per model (median). Default: 5.')
    parser.add_argument('--iters', type=int, default=3, help='iterations per timed round. Default: 3.')
    parser.add_argument('--warmup', type=int, default=2, help='untimed iterations per model. Default: 2.')
    parser.add_argument('--modes', nargs='+', default=['infer', 'train'], choices=['infer', 'train'])
    parser.add_argument('--models', nargs='+', default=list(MODELS), choices=MODELS)
    parser.add_argument('--bf16', default='auto', choices=['auto', 'on', 'off'],
                        help='extra bf16-autocast inference rows: auto = when the CPU has AVX512-BF16.')
    parser.add_argument('--no-memory', action='store_true', help='skip the (slow) peak-memory pass.')
    parser.add_argument('--compile', action='store_true',
                        help='time every model through torch.compile (Inductor); compilation happens in the '
                        'untimed warm-up. Default: eager.')
    parser.add_argument('--freeze', action='store_true',
                        help='inference through torch.compile with Inductor freezing (weights folded in and '
                        'pre-packed; vit_plugin.deploy.compile_for_inference) for every model. Inference only.')
    parser.add_argument('--matmul-size', type=int, default=2048,
                        help='side of the square matmul that measures the peak. Default: 2048.')
    parser.add_argument('--peak-iters', type=int, default=3,
                        help='square matmuls per peak reading (one reading next to every timing). Default: 3.')
    parser.add_argument('--out', default='work_dirs/benchmark/benchmark.json', help='JSON output path.')
    args = parser.parse_args(argv)
    if args.freeze and args.modes != ['infer']:
        parser.error('--freeze times inference only (frozen weights cannot train): add --modes infer')
    return args


# ---------------------------------------------------------------------------------------- machine
def cpu_flags() -> set:
    """CPU feature flags from /proc/cpuinfo (empty where unavailable)."""
    try:
        with open('/proc/cpuinfo') as f:
            for line in f:
                if line.startswith('flags'):
                    return set(line.split(':', 1)[1].split())
    except OSError:
        pass
    return set()


def has_bf16(flags: set) -> bool:
    return bool({'avx512_bf16', 'amx_bf16'} & flags)


def wants_bf16(args, flags: set) -> bool:
    """Whether bf16 numbers are reported: asked for, or 'auto' on a CPU with native bf16."""
    return args.dtype == 'bf16' or args.bf16 == 'on' or (args.bf16 == 'auto' and has_bf16(flags))


def make_matmul_step(dtype: torch.dtype = torch.float32, size: int = 2048) -> Callable:
    """One square ``size`` matmul (2 * size**3 FLOPs) on preallocated operands."""
    a = torch.randn(size, size).to(dtype)
    b = torch.randn(size, size).to(dtype)
    out = torch.empty(size, size, dtype=dtype)
    return lambda: torch.mm(a, b, out=out)


def time_median(step: Callable, repeats: int = 5, warmup: int = 2) -> float:
    for _ in range(warmup):
        step()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def time_rounds(steps: Dict[str, Callable], peak_step: Callable, peak_flops: float, repeats: int,
                iters: int, peak_iters: int = 3) -> Tuple[Dict[str, List[float]], Dict[str, List[float]]]:
    """Time every step once per round, in turns, with the matmul peak read between them.

    Returns the seconds per iteration of each step in each round, and for each step and round the
    peak GFLOP/s as the mean of the readings just before and just after it. This VM's speed changes
    within seconds, so a fraction of peak is only meaningful against a peak read at the same moment.
    A reading times ``peak_iters`` matmuls back to back (single 2048 matmuls here range from 100 to
    200 GFLOP/s from one call to the next).
    """
    def read_peak():
        start = time.perf_counter()
        for _ in range(peak_iters):
            peak_step()
        return peak_iters * peak_flops / (time.perf_counter() - start) / 1e9

    times = {name: [] for name in steps}
    peaks = {name: [] for name in steps}
    for _ in range(repeats):
        before = read_peak()
        for name, step in steps.items():
            start = time.perf_counter()
            for _ in range(iters):
                step()
            times[name].append((time.perf_counter() - start) / iters)
            after = read_peak()
            peaks[name].append((before + after) / 2)
            before = after
    return times, peaks


def matmul_gflops(dtype: torch.dtype = torch.float32, size: int = 2048, repeats: int = 5) -> float:
    """Median GFLOP/s of a square ``size`` matmul with the current thread setting."""
    return 2 * size**3 / time_median(make_matmul_step(dtype, size), repeats) / 1e9


def make_gemm_ceiling_step(arch: str, img_size: int, patch: int, batch: int) -> Callable:
    """One forward's worth of a ViT's matrix products alone, with their real shapes.

    Per block: the qkv, output, fc1 and fc2 GEMMs on (batch * tokens) rows, and per head q @ k^T and
    attention @ v as batched matmuls; plus the patch embedding as a GEMM. Its FLOPs are
    ``batch * forward_flops(arch, img_size, patch, num_classes=0)``.
    """
    dims, layers, heads, mlp = arch_dims(arch)
    patches = (img_size // patch)**2
    rows, tokens, head_dims = batch * (patches + 1), patches + 1, dims // heads
    x = torch.randn(rows, dims)
    weights = [torch.randn(3 * dims, dims), torch.randn(dims, dims), torch.randn(mlp, dims), torch.randn(dims, mlp)]
    hidden = torch.randn(rows, mlp)
    q = torch.randn(batch * heads, tokens, head_dims)
    scores = torch.randn(batch * heads, tokens, tokens)
    pixels, kernel = torch.randn(batch * patches, 3 * patch * patch), torch.randn(dims, 3 * patch * patch)

    def forward_gemms():
        pixels @ kernel.t()
        for _ in range(layers):
            x @ weights[0].t()
            x @ weights[1].t()
            x @ weights[2].t()
            hidden @ weights[3].t()
            torch.bmm(q, q.transpose(1, 2))
            torch.bmm(scores, q)
    return forward_gemms


# ---------------------------------------------------------------------------------------- models
def arch_dims(arch: str) -> Tuple[int, int, int, int]:
    """(embed dims, layers, heads, MLP dims) of an arch of :attr:`ViT.arch_zoo`."""
    d = ViT.arch_zoo[arch]
    return d['embed_dims'], d['num_layers'], d['num_heads'], d['mlp_dims']


def forward_flops(arch: str, img_size: int, patch: int, num_classes: int) -> int:
    """Forward FLOPs of a class-token ViT classifier per image: 2 x the multiply-adds of
    :func:`vit_plugin.analysis.vit_flops` (matmuls and convolutions)."""
    return 2 * vit_flops(arch, patch, img_size, num_classes=num_classes)


class Classifier(nn.Module):
    """A backbone returning a tuple whose last entry is the class token, plus a linear head."""

    def __init__(self, backbone: nn.Module, dims: int, num_classes: int):
        super().__init__()
        self.backbone = backbone
        self.head = nn.Linear(dims, num_classes)

    def forward(self, x):
        return self.head(self.backbone(x)[-1])


def build_model(name: str, arch: str, args) -> nn.Module:
    dims, layers, heads, mlp = arch_dims(arch)
    if name == 'ours':
        backbone = ViT(arch=dict(embed_dims=dims, num_layers=layers, num_heads=heads, mlp_dims=mlp),
                       img_size=args.img_size, patch_size=args.patch_size)
        backbone.init_weights()
        return Classifier(backbone, dims, args.num_classes)
    if name == 'timm':
        from timm.models.vision_transformer import VisionTransformer
        return VisionTransformer(img_size=args.img_size, patch_size=args.patch_size, embed_dim=dims, depth=layers,
                                 num_heads=heads, mlp_ratio=mlp / dims, num_classes=args.num_classes)
    from mmengine.logging import MMLogger
    from mmpretrain.models.backbones import VisionTransformer
    backbone = VisionTransformer(
        arch=dict(embed_dims=dims, num_layers=layers, num_heads=heads, feedforward_channels=mlp),
        img_size=args.img_size, patch_size=args.patch_size, out_type='cls_token')
    logger = MMLogger.get_current_instance()
    level = logger.level
    logger.setLevel('WARNING')  # init_weights logs one line per parameter
    backbone.init_weights()
    logger.setLevel(level)
    return Classifier(backbone, dims, args.num_classes)


# ---------------------------------------------------------------------------------------- timing
def make_step(model: nn.Module, mode: str, x: torch.Tensor, y: torch.Tensor, autocast: bool,
              compile: bool = False, freeze: bool = False) -> Callable:
    """One timed iteration: an inference forward, or forward + cross-entropy + backward + AdamW step.

    ``freeze`` (inference only): compiled with Inductor freezing, see :mod:`vit_plugin.deploy`.
    """
    if freeze:
        frozen = compile_for_inference(model)

        def step():
            with torch.autocast('cpu', dtype=torch.bfloat16, enabled=autocast):
                frozen(x)
        return step
    forward = torch.compile(model) if compile else model
    if mode == 'infer':
        model.eval()

        # no_grad under torch.compile: dynamo's guards trip over inference-mode tensors (seen with
        # mmpretrain's ViT in torch 2.9)
        no_autograd = torch.no_grad if compile else torch.inference_mode

        def step():
            with no_autograd(), torch.autocast('cpu', dtype=torch.bfloat16, enabled=autocast):
                forward(x)
        return step
    model.train()
    optim = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step():
        optim.zero_grad(set_to_none=True)
        with torch.autocast('cpu', dtype=torch.bfloat16, enabled=autocast):
            loss = F.cross_entropy(forward(x), y)
        loss.backward()
        optim.step()
    return step


def peak_memory_mb(step: Callable) -> float:
    """Peak bytes allocated by torch during one call of ``step`` (CPU allocator events), in MiB."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    events = sorted((e for e in prof.events() if e.cpu_memory_usage), key=lambda e: e.time_range.start)
    level = peak = 0
    for event in events:
        level += event.cpu_memory_usage
        peak = max(peak, level)
    return peak / 2**20


def run_arch(arch: str, args, flags: set) -> List[Dict]:
    x = torch.randn(args.batch, 3, args.img_size, args.img_size)
    y = torch.randint(0, args.num_classes, (args.batch, ))
    models, notes = {}, {}
    for name in args.models:
        try:
            torch.manual_seed(0)
            models[name] = build_model(name, arch, args)
        except ImportError as err:  # a peer that is not installed is reported, not fatal
            notes[name] = f'not available: {err}'
    params = {name: sum(p.numel() for p in m.parameters()) for name, m in models.items()}
    configs = [(mode, args.dtype == 'bf16') for mode in args.modes]
    if wants_bf16(args, flags) and args.dtype == 'fp32' and 'infer' in args.modes:
        configs.append(('infer', True))
    # References timed in the same rounds as the models, so drifting machine speed hits them alike:
    # the square matmul peak (in the run's dtype) and, for fp32 inference, the model's GEMMs alone.
    references = {'matmul peak': {autocast: make_matmul_step(torch.bfloat16 if autocast else torch.float32,
                                                         args.matmul_size) for autocast in {a for _, a in configs}},
                  'GEMM ceiling': make_gemm_ceiling_step(arch, args.img_size, args.patch_size, args.batch)}
    reference_flops = {'matmul peak': 2 * args.matmul_size**3,
                       'GEMM ceiling': args.batch * forward_flops(arch, args.img_size, args.patch_size, 0)}
    rows = []
    for mode, autocast in configs:
        steps = {name: make_step(m, mode, x, y, autocast, args.compile, args.freeze) for name, m in models.items()}
        if (mode, autocast) == ('infer', False):
            steps['GEMM ceiling'] = references['GEMM ceiling']
        peak_step = references['matmul peak'][autocast]
        for name, step in [('matmul peak', peak_step)] + list(steps.items()):
            try:
                for _ in range(args.warmup):
                    step()
            except Exception as err:  # e.g. a peer torch.compile cannot handle: reported, not fatal
                if name == 'ours' or name in reference_flops:
                    raise
                del steps[name]
                note = f'{mode} {"bf16" if autocast else "fp32"} failed: {type(err).__name__}: ' \
                       f'{(str(err).splitlines() or [""])[0][:160]}'
                notes[name] = f'{notes[name]}; {note}' if name in notes else note
                print(f'  {arch} {name}: {note}', flush=True)
        times, peaks = time_rounds(steps, peak_step, reference_flops['matmul peak'], args.repeats, args.iters,
                                   args.peak_iters)
        flops = forward_flops(arch, args.img_size, args.patch_size, args.num_classes) * args.batch
        if mode == 'train':
            flops *= 3  # backward costs two forwards (grads w.r.t. inputs and weights)
        all_peaks = [p for name in peaks for p in peaks[name]]
        ceiling = times.get('GEMM ceiling')
        dtype = 'bf16-autocast' if autocast else 'fp32'
        print(f'  {arch} {mode} {dtype}: matmul peak {statistics.median(all_peaks):.1f} GFLOP/s'
              + (f', GEMM ceiling {reference_flops["GEMM ceiling"] / statistics.median(ceiling) / 1e9:.1f} GFLOP/s'
                 if ceiling else ''), flush=True)
        for name, step in steps.items():
            if name in reference_flops:
                continue
            median = statistics.median(times[name])
            gflops_rounds = [flops / t / 1e9 for t in times[name]]
            print(f'  {arch} {mode} {dtype} {name}: {args.batch / median:.3f} img/s', flush=True)
            row = dict(arch=arch, model=name, mode=mode, dtype=dtype,
                       params=params[name], img_per_s=args.batch / median, ms_per_iter=median * 1e3,
                       times_s=times[name], gflops=flops / median / 1e9,
                       matmul_peak_gflops=statistics.median(all_peaks), peak_gflops_rounds=peaks[name],
                       of_peak=statistics.median(g / p for g, p in zip(gflops_rounds, peaks[name])),
                       gemm_ceiling_gflops=None, of_gemm_ceiling=None,
                       peak_mb=None if args.no_memory else peak_memory_mb(step))
            if ceiling:
                ceiling_rounds = [reference_flops['GEMM ceiling'] / t / 1e9 for t in ceiling]
                row.update(gemm_ceiling_gflops=statistics.median(ceiling_rounds),
                           of_gemm_ceiling=statistics.median(g / c for g, c in zip(gflops_rounds, ceiling_rounds)))
            rows.append(row)
    for name, note in notes.items():
        rows.append(dict(arch=arch, model=name, note=note))
    return rows


def versus_best_peer(rows: List[Dict]) -> None:
    """Add ``vs_best_peer`` to our rows: our speed over the faster peer's, paired by round.

    The faster peer is the one with the higher median throughput. The ratio is the median over rounds
    of (peer time / our time) within the same round: both models ran back to back, so the machine's
    slow drifts (other tenants, clock changes) cancel, which a ratio of the two medians does not do.
    """
    for row in rows:
        if 'note' in row or row['model'] != 'ours':
            continue
        peers = [r for r in rows if 'note' not in r and r['model'] != 'ours'
                 and (r['arch'], r['mode'], r['dtype']) == (row['arch'], row['mode'], row['dtype'])]
        if not peers:
            continue
        best = max(peers, key=lambda r: r['img_per_s'])
        row['best_peer'] = best['model']
        row['vs_best_peer'] = statistics.median(p / o for o, p in zip(row['times_s'], best['times_s']))
        row['vs_best_peer_rounds'] = [p / o for o, p in zip(row['times_s'], best['times_s'])]


def print_table(rows: List[Dict]):
    header = f"{'arch':<5}{'mode':<7}{'dtype':<15}{'model':<12}{'img/s':>9}{'ms/iter':>10}{'GFLOP/s':>10}" \
             f"{'of peak':>9}{'of GEMMs':>10}{'peak MiB':>10}{'vs best peer':>16}"
    print(header)
    print('-' * len(header))
    for row in rows:
        if 'note' in row:
            print(f"{row['arch']:<5}{row['model']:<12}{row['note']}")
            continue
        ratio = f"{row['vs_best_peer']:.3f} {row['best_peer'][:4]}" if 'vs_best_peer' in row else ''
        mem = f"{row['peak_mb']:.0f}" if row['peak_mb'] is not None else '-'
        # the GEMM ceiling is an fp32 inference reference: other rows get '-'
        of_gemms = f"{row['of_gemm_ceiling']:.2f}" if row['of_gemm_ceiling'] else '-'
        print(f"{row['arch']:<5}{row['mode']:<7}{row['dtype']:<15}{row['model']:<12}{row['img_per_s']:>9.1f}"
              f"{row['ms_per_iter']:>10.1f}{row['gflops']:>10.1f}{row['of_peak']:>9.2f}{of_gemms:>10}{mem:>10}"
              f"{ratio:>16}")


def main(argv=None):
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    flags = cpu_flags()
    peaks = {'fp32': matmul_gflops(torch.float32, args.matmul_size)}
    rows = []
    for arch in args.arch:
        rows.extend(run_arch(arch, args, flags))
    peaks_after = {'fp32': matmul_gflops(torch.float32, args.matmul_size)}
    how = 'torch.compile + freezing' if args.freeze else 'torch.compile' if args.compile else 'eager'
    print(f'torch {torch.__version__}, {args.threads} threads, batch {args.batch}, {args.img_size} px, '
          f'patch {args.patch_size}, {how}; square-matmul fp32 GFLOP/s {peaks["fp32"]:.1f} at the start, '
          f'{peaks_after["fp32"]:.1f} at the end ("of peak" and "of GEMMs" are medians of per-round ratios to '
          f'readings taken next to each timing); AVX512-BF16: {has_bf16(flags)}')
    versus_best_peer(rows)
    print_table(rows)
    result = dict(argv=sys.argv[1:] if argv is None else argv, torch=torch.__version__, python=platform.python_version(),
                  cpu=platform.processor() or platform.machine(), threads=args.threads, batch=args.batch,
                  img_size=args.img_size, patch_size=args.patch_size, compile=args.compile or args.freeze, freeze=args.freeze, avx512_bf16=has_bf16(flags),
                  matmul_gflops=peaks, matmul_gflops_after=peaks_after, rows=rows)
    out_dir = os.path.dirname(args.out)
    if out_dir:
        os.makedirs(out_dir, exist_ok=True)
    with open(args.out, 'w') as f:
        json.dump(result, f, indent=1)
    print(f'wrote {args.out}')
    return result
