"""Throughput and peak memory of vit_plugin's ViT against timm's and mmpretrain's, in one process.

For every requested arch the three models are built with identical shapes (a ViT backbone plus a
linear classifier on the class token), then timed in turns: each repeat runs every model once
(inference, then a training step: forward + cross-entropy + backward + AdamW step) so that load from
other processes hits all of them alike, and the median over repeats is reported. "vs best peer" is
the median of the per-round ratios to the faster peer (paired, so drift between rounds cancels).
Two references are timed in the same rounds, and each model's achieved GFLOP/s (analytic FLOPs of
the architecture / time) is given as a fraction of both, again as the median of per-round ratios:
the machine's matmul peak (a square 2048 matmul in the run's dtype, read just before and just after
each model's timing, since a shared machine's speed can change within seconds) and, for fp32 inference, the
"GEMM ceiling": the model's own matrix products alone (dense layers and attention matmuls with their
real shapes, back to back), i.e. what the model would reach if everything else (norms, GELU,
softmax, residuals, layouts) were free. On CPUs with AVX512-BF16 (or AMX-BF16) bf16 autocast
inference is reported as well. ``--compile`` times every model through ``torch.compile``;
``--freeze`` (inference) through ``torch.compile`` with Inductor freezing (pre-packed weights,
:mod:`vit_plugin.deploy`), PyTorch's own route to fast CPU inference.

``--device cuda`` times on the GPU: CUDA events around every timing with a synchronisation at its
end, autocast on the GPU (``--dtype bf16``, the default there, or ``fp16`` with a loss scaler for
training), AdamW with its fused kernel for every model, one or more GPU batch sizes
(``--batch 64 128 256``), the peak of ``torch.cuda.max_memory_allocated`` over one step, and model-FLOP
utilisation against two references: the square matmul timed in the same rounds (in the run's dtype)
and the GPU's datasheet dense rate (:mod:`benchmarks.gpu_datasheet`; "unknown" for a GPU not in
its table). A batch that does not fit becomes a note. ``--guard`` adds two training rows of our
model through mmengine's ``OptimWrapper``, one with the non-finite guard
(:class:`vit_plugin.GuardedOptimWrapper`) and one without, timed in the same rounds: their
paired ratio is the guard's cost.

Examples::

    python tools/analysis/benchmark.py --arch s b --batch 8 --img-size 224 --threads 2 \
        --out work_dirs/benchmark/vit_cpu.json
    python tools/analysis/benchmark.py --device cuda --arch s b l --batch 128 --compile \
        --out work_dirs/benchmark/vit_cuda.json
"""
import argparse
import json
import os
import platform
import statistics
import sys
from typing import Callable, Dict, List, Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from vit_plugin.evaluation.model_complexity import vit_flops
from benchmarks.gpu_datasheet import cuda_device_info, datasheet_tflops
from benchmarks.peak_memory import cpu_peak_bytes, cuda_peak_bytes
from benchmarks.timing import CudaStopwatch, Stopwatch, paired_rounds, time_median
from benchmarks.toy_classifier import Classifier, vit_classifier
from vit_plugin.deploy import compile_for_inference
from vit_plugin.engine.device_defaults import set_tf32
from vit_plugin.engine.optimizers import (AutocastOptimWrapper, GuardedAutocastOptimWrapper,
                                          GuardedOptimWrapper)
from vit_plugin.models.backbones import ViT

MODELS = ('ours', 'timm', 'mmpretrain')
# With --guard: our model trained through mmengine's OptimWrapper, without and with the guard.
GUARD_ROWS = ('ours+wrapper', 'ours+guard')
DTYPES = {'fp32': torch.float32, 'bf16': torch.bfloat16, 'fp16': torch.float16}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--device', default='cpu', choices=['cpu', 'cuda'],
                        help='where the models run. Default: cpu.')
    parser.add_argument('--arch', nargs='+', default=['s', 'b'], choices=sorted(ViT.arch_zoo),
                        help="names of ViT.arch_zoo (the paper's Table 1 plus Ti and S). Default: s b.")
    parser.add_argument('--layers', type=int, default=None,
                        help="override the arch's depth (a quick check with fewer blocks). Default: the arch's.")
    parser.add_argument('--patch-size', type=int, default=16)
    parser.add_argument('--img-size', type=int, default=224)
    parser.add_argument('--batch', type=int, nargs='+', default=None,
                        help='images per step, one or more. Default: 8 on cpu, 64 128 256 on cuda.')
    parser.add_argument('--num-classes', type=int, default=1000)
    parser.add_argument('--dtype', default=None, choices=['fp32', 'bf16', 'fp16'],
                        help='fp32, or autocast to bf16 / fp16 (cuda only; training with a loss scaler) for '
                        'every timed run. Default: fp32 on cpu, bf16 on cuda.')
    parser.add_argument('--threads', type=int, default=2, help='torch intra-op threads. Default: 2.')
    parser.add_argument('--repeats', type=int, default=5, help='timed rounds per model (median). Default: 5.')
    parser.add_argument('--iters', type=int, default=None,
                        help='iterations per timed round. Default: 3 on cpu, 10 on cuda.')
    parser.add_argument('--warmup', type=int, default=2, help='untimed iterations per model. Default: 2.')
    parser.add_argument('--modes', nargs='+', default=['infer', 'train'], choices=['infer', 'train'])
    parser.add_argument('--models', nargs='+', default=list(MODELS), choices=MODELS)
    parser.add_argument('--bf16', default='auto', choices=['auto', 'on', 'off'],
                        help='cpu: extra bf16-autocast inference rows: auto = when the CPU has AVX512-BF16.')
    parser.add_argument('--no-memory', action='store_true', help='skip the (slow on cpu) peak-memory pass.')
    parser.add_argument('--compile', action='store_true',
                        help='time every model through torch.compile (Inductor); compilation happens in the '
                        'untimed warm-up. Default: eager.')
    parser.add_argument('--freeze', action='store_true',
                        help='inference through torch.compile with Inductor freezing (weights folded in and '
                        'pre-packed; vit_plugin.deploy.compile_for_inference) for every model. Inference only.')
    parser.add_argument('--guard', action='store_true',
                        help='add training rows of our model through OptimWrapper without and with the '
                        'non-finite guard (the guard\'s cost, paired by round).')
    parser.add_argument('--no-tf32', action='store_true', help='cuda: fp32 matmuls without TF32.')
    parser.add_argument('--matmul-size', type=int, default=None,
                        help='side of the square matmul that measures the peak. Default: 2048 on cpu, 8192 on cuda.')
    parser.add_argument('--peak-iters', type=int, default=None,
                        help='square matmuls per peak reading (one reading next to every timing). '
                        'Default: 3 on cpu, 20 on cuda.')
    parser.add_argument('--out', default='work_dirs/benchmark/benchmark.json', help='JSON output path.')
    args = parser.parse_args(argv)
    cuda = args.device == 'cuda'
    if cuda and not torch.cuda.is_available():
        parser.error('--device cuda: torch sees no CUDA device here (torch.cuda.is_available() is False)')
    for key, cpu_value, cuda_value in (('batch', [8], [64, 128, 256]), ('dtype', 'fp32', 'bf16'),
                                       ('iters', 3, 10), ('matmul_size', 2048, 8192), ('peak_iters', 3, 20)):
        if getattr(args, key) is None:
            setattr(args, key, cuda_value if cuda else cpu_value)
    if args.dtype == 'fp16' and not cuda:
        parser.error('--dtype fp16 needs --device cuda (CPU mixed precision is bf16)')
    if args.freeze and args.modes != ['infer']:
        parser.error('--freeze times inference only (frozen weights cannot train): add --modes infer')
    if args.freeze and cuda:
        parser.error('--freeze is the CPU inference path (Inductor freezing with pre-packed MKL weights); '
                     'on cuda use --compile')
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
    """CPU: whether bf16 numbers are reported: asked for, or 'auto' on a CPU with native bf16."""
    return args.dtype == 'bf16' or args.bf16 == 'on' or (args.bf16 == 'auto' and has_bf16(flags))


def make_matmul_step(dtype: torch.dtype = torch.float32, size: int = 2048, device: str = 'cpu') -> Callable:
    """One square ``size`` matmul (2 * size**3 FLOPs) on preallocated operands."""
    a = torch.randn(size, size, device=device).to(dtype)
    b = torch.randn(size, size, device=device).to(dtype)
    out = torch.empty(size, size, dtype=dtype, device=device)
    return lambda: torch.mm(a, b, out=out)


def time_rounds(steps: Dict[str, Callable], peak_step: Callable, peak_flops: float, repeats: int,
                iters: int, peak_iters: int = 3, stopwatch: Optional[Stopwatch] = None
                ) -> Tuple[Dict[str, List[float]], Dict[str, List[float]]]:
    """Time every step once per round, in turns, with the matmul peak read between them.

    Returns the seconds per iteration of each step in each round, and for each step and round the
    peak GFLOP/s as the mean of the readings just before and just after it. A shared machine's speed
    can change within seconds, so a fraction of peak is only meaningful against a peak read at the same
    moment. A reading times ``peak_iters`` matmuls back to back, since single matmuls vary widely from
    one call to the next (docs/benchmarks.md). ``stopwatch``: :class:`CudaStopwatch` on a GPU.
    """
    watch = stopwatch or Stopwatch()
    reading = {}

    def read_peak():
        watch.start()
        for _ in range(peak_iters):
            peak_step()
        return peak_iters * peak_flops / watch.stop() / 1e9

    def first_reading():
        reading['before'] = read_peak()

    def next_reading(name):
        after = read_peak()
        peaks[name].append((reading['before'] + after) / 2)
        reading['before'] = after

    def iterations(step):
        def run():
            for _ in range(iters):
                step()
        return run

    peaks = {name: [] for name in steps}
    times = paired_rounds({name: iterations(step) for name, step in steps.items()}, repeats, stopwatch=watch,
                          before_round=first_reading, after_step=next_reading)
    return {name: [t / iters for t in ts] for name, ts in times.items()}, peaks


def matmul_gflops(dtype: torch.dtype = torch.float32, size: int = 2048, repeats: int = 5, device: str = 'cpu') -> float:
    """Median GFLOP/s of a square ``size`` matmul with the current thread setting."""
    watch = CudaStopwatch() if device == 'cuda' else None
    return 2 * size**3 / time_median(make_matmul_step(dtype, size, device), repeats, stopwatch=watch) / 1e9


def make_gemm_ceiling_step(arch: str, img_size: int, patch: int, batch: int, device: str = 'cpu',
                           layers: Optional[int] = None) -> Callable:
    """One forward's worth of a ViT's matrix products alone, with their real shapes.

    Per block: the qkv, output, fc1 and fc2 GEMMs on (batch * tokens) rows, and per head q @ k^T and
    attention @ v as batched matmuls; plus the patch embedding as a GEMM. Its FLOPs are
    ``batch * forward_flops(arch, img_size, patch, num_classes=0, layers=layers)``.
    """
    dims, layers, heads, mlp = arch_dims(arch, layers)
    patches = (img_size // patch)**2
    rows, tokens, head_dims = batch * (patches + 1), patches + 1, dims // heads

    def randn(*shape):
        return torch.randn(*shape, device=device)
    x = randn(rows, dims)
    weights = [randn(3 * dims, dims), randn(dims, dims), randn(mlp, dims), randn(dims, mlp)]
    hidden = randn(rows, mlp)
    q = randn(batch * heads, tokens, head_dims)
    scores = randn(batch * heads, tokens, tokens)
    pixels, kernel = randn(batch * patches, 3 * patch * patch), randn(dims, 3 * patch * patch)

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
def arch_dims(arch: str, layers: Optional[int] = None) -> Tuple[int, int, int, int]:
    """(embed dims, layers, heads, MLP dims) of an arch of :attr:`ViT.arch_zoo` (``layers`` overrides
    its depth)."""
    d = ViT.arch_zoo[arch]
    return d['embed_dims'], layers or d['num_layers'], d['num_heads'], d['mlp_dims']


def forward_flops(arch: str, img_size: int, patch: int, num_classes: int, layers: Optional[int] = None) -> int:
    """Forward FLOPs of a class-token ViT classifier per image: 2 x the multiply-adds of
    :func:`vit_plugin.evaluation.model_complexity.vit_flops` (matmuls and convolutions)."""
    spec = dict(ViT.arch_zoo[arch], **({'num_layers': layers} if layers else {}))
    return 2 * vit_flops(spec, patch, img_size, num_classes=num_classes)


def build_model(name: str, arch: str, args) -> nn.Module:
    dims, layers, heads, mlp = arch_dims(arch, getattr(args, 'layers', None))
    if name == 'ours':
        return vit_classifier(dims, layers, heads, mlp, args.img_size, args.patch_size, args.num_classes,
                              init_weights=True)
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
def _optimizer(model: nn.Module, device: str) -> torch.optim.Optimizer:
    # The fused kernel on GPUs (what tools/train.py uses there); torch's default elsewhere.
    return torch.optim.AdamW(model.parameters(), lr=1e-4, **({'fused': True} if device == 'cuda' else {}))


def make_step(model: nn.Module, mode: str, x: torch.Tensor, y: torch.Tensor, cast: Optional[torch.dtype],
              compile: bool = False, freeze: bool = False, wrapper: Optional[str] = None) -> Callable:
    """One timed iteration: an inference forward, or forward + cross-entropy + backward + AdamW step.

    ``cast``: autocast dtype on the inputs' device (None: fp32); fp16 training scales the loss
    (``torch.amp.GradScaler``). ``freeze`` (CPU inference only): compiled with Inductor freezing, see
    :mod:`vit_plugin.deploy`. ``wrapper`` (training only): ``'plain'`` or ``'guarded'`` runs the update
    through mmengine's ``OptimWrapper`` (:class:`vit_plugin.AutocastOptimWrapper` for fp16), the
    latter through its guarded type (:class:`vit_plugin.GuardedOptimWrapper`), whose verdicts are read
    on the host every 10 steps as ``NonFiniteGuardHook`` does.
    """
    device = x.device.type

    def autocast():
        return torch.autocast(device, dtype=cast or torch.float32, enabled=cast is not None)

    if freeze:
        frozen = compile_for_inference(model)

        def step():
            with autocast():
                frozen(x)
        return step
    forward = torch.compile(model, dynamic=False) if compile else model
    if mode == 'infer':
        model.eval()

        # no_grad under torch.compile: dynamo's guards can trip over inference-mode tensors
        # (docs/benchmarks.md, compiled runs)
        no_autograd = torch.no_grad if compile else torch.inference_mode

        def step():
            with no_autograd(), autocast():
                forward(x)
        return step
    model.train()
    optim = _optimizer(model, device)
    if wrapper is not None:
        return _wrapped_train_step(forward, optim, x, y, cast, autocast, guarded=wrapper == 'guarded')
    scaler = torch.amp.GradScaler(device) if cast is torch.float16 else None

    def step():
        optim.zero_grad(set_to_none=True)
        with autocast():
            loss = F.cross_entropy(forward(x), y)
        if scaler is None:
            loss.backward()
            optim.step()
        else:
            scaler.scale(loss).backward()
            scaler.step(optim)
            scaler.update()
    return step


def _wrapped_train_step(forward, optim, x, y, cast, autocast, guarded: bool) -> Callable:
    from mmengine.optim import OptimWrapper

    if cast is torch.float16:
        wrapper = (GuardedAutocastOptimWrapper if guarded else AutocastOptimWrapper)(dtype='float16', optimizer=optim)
    else:
        wrapper = (GuardedOptimWrapper if guarded else OptimWrapper)(optim)
    verdicts = []

    def step():
        with autocast():
            loss = F.cross_entropy(forward(x), y)
        wrapper.update_params(loss)  # backward, step, zero_grad
        if guarded:
            verdicts.append(wrapper.take_verdict())
            if len(verdicts) == 10:  # the hook's host read (default check_interval)
                torch.stack(verdicts).tolist()
                verdicts.clear()
    return step


def peak_memory_mb(step: Callable) -> float:
    """Peak bytes allocated by torch during one call of ``step`` (CPU allocator events), in MiB."""
    return cpu_peak_bytes(step) / 2**20


def cuda_peak_memory_mb(step: Callable) -> float:
    """``torch.cuda.max_memory_allocated`` over one call of ``step`` (weights, optimizer state and
    activations of the process at that moment), in MiB."""
    return cuda_peak_bytes(step) / 2**20


def _dtype_label(cast: Optional[torch.dtype]) -> str:
    return {None: 'fp32', torch.bfloat16: 'bf16-autocast', torch.float16: 'fp16-autocast'}[cast]


def _configs(args, flags: set) -> List[Tuple[str, Optional[torch.dtype]]]:
    """(mode, autocast dtype) pairs to time."""
    run_cast = None if args.dtype == 'fp32' else DTYPES[args.dtype]
    configs = [(mode, run_cast) for mode in args.modes]
    if args.device == 'cpu' and wants_bf16(args, flags) and args.dtype == 'fp32' and 'infer' in args.modes:
        configs.append(('infer', torch.bfloat16))
    return configs


def _failure(err: Exception) -> str:
    return f'{type(err).__name__}: {(str(err).splitlines() or [""])[0][:160]}'


def run_arch(arch: str, args, flags: set) -> List[Dict]:
    device, cuda = args.device, args.device == 'cuda'
    models, notes = {}, {}
    names = list(args.models) + (list(GUARD_ROWS) if args.guard and 'train' in args.modes else [])
    for name in names:
        try:
            torch.manual_seed(0)
            models[name] = build_model('ours' if name in GUARD_ROWS else name, arch, args).to(device)
        except ImportError as err:  # a peer that is not installed is reported, not fatal
            notes[name] = f'not available: {err}'
    params = {name: sum(p.numel() for p in m.parameters()) for name, m in models.items()}
    stopwatch = CudaStopwatch() if cuda else Stopwatch()
    sheet = {}
    if cuda:
        name = torch.cuda.get_device_name()
        sheet = {torch.bfloat16: datasheet_tflops(name, 'bf16'), torch.float16: datasheet_tflops(name, 'fp16')}
    configs = _configs(args, flags)
    rows = []
    for batch in args.batch:
        x = torch.randn(batch, 3, args.img_size, args.img_size, device=device)
        y = torch.randint(0, args.num_classes, (batch, ), device=device)
        # References timed in the same rounds as the models, so drifting machine speed hits them alike:
        # the square matmul peak (in the run's dtype) and, for fp32 inference, the model's GEMMs alone.
        peak_steps = {cast: make_matmul_step(cast or torch.float32, args.matmul_size, device)
                      for cast in {c for _, c in configs}}
        reference_flops = {'matmul peak': 2 * args.matmul_size**3,
                           'GEMM ceiling': batch * forward_flops(arch, args.img_size, args.patch_size, 0, args.layers)}
        for mode, cast in configs:
            label = f'{mode} {_dtype_label(cast)} batch {batch}'
            steps = {}
            for name, model in models.items():
                if name in GUARD_ROWS and mode != 'train':
                    continue
                wrapper = {'ours+wrapper': 'plain', 'ours+guard': 'guarded'}.get(name)
                steps[name] = make_step(model, mode, x, y, cast, args.compile, args.freeze, wrapper)
            if (mode, cast) == ('infer', None):
                steps['GEMM ceiling'] = make_gemm_ceiling_step(arch, args.img_size, args.patch_size, batch, device,
                                                               args.layers)
            peak_step = peak_steps[cast]
            for name, step in [('matmul peak', peak_step)] + list(steps.items()):
                try:
                    for _ in range(args.warmup):
                        step()
                except Exception as err:  # e.g. a peer torch.compile cannot handle: reported, not fatal
                    oom = cuda and isinstance(err, torch.cuda.OutOfMemoryError)
                    if not oom and (name == 'ours' or name in reference_flops):
                        raise
                    del steps[name]
                    note = f'{label}: out of memory' if oom else f'{label} failed: {_failure(err)}'
                    notes[name] = f'{notes[name]}; {note}' if name in notes else note
                    print(f'  {arch} {name}: {note}', flush=True)
                    if oom:
                        torch.cuda.empty_cache()
            if not [n for n in steps if n not in reference_flops]:
                continue
            times, peaks = time_rounds(steps, peak_step, reference_flops['matmul peak'], args.repeats, args.iters,
                                       args.peak_iters, stopwatch=stopwatch)
            flops = forward_flops(arch, args.img_size, args.patch_size, args.num_classes, args.layers) * batch
            if mode == 'train':
                flops *= 3  # backward costs two forwards (grads w.r.t. inputs and weights)
            all_peaks = [p for name in peaks for p in peaks[name]]
            ceiling = times.get('GEMM ceiling')
            dtype = _dtype_label(cast)
            print(f'  {arch} {label}: matmul peak {statistics.median(all_peaks):.1f} GFLOP/s'
                  + (f', GEMM ceiling {reference_flops["GEMM ceiling"] / statistics.median(ceiling) / 1e9:.1f} GFLOP/s'
                     if ceiling else ''), flush=True)
            for name, step in steps.items():
                if name in reference_flops:
                    continue
                median = statistics.median(times[name])
                gflops_rounds = [flops / t / 1e9 for t in times[name]]
                print(f'  {arch} {label} {name}: {batch / median:.3f} img/s', flush=True)
                datasheet = sheet.get(cast)
                if args.no_memory:
                    memory = None
                else:
                    memory = cuda_peak_memory_mb(step) if cuda else peak_memory_mb(step)
                row = dict(arch=arch, model=name, mode=mode, dtype=dtype, batch=batch, device=device,
                           params=params[name], img_per_s=batch / median, ms_per_iter=median * 1e3,
                           times_s=times[name], gflops=flops / median / 1e9,
                           matmul_peak_gflops=statistics.median(all_peaks), peak_gflops_rounds=peaks[name],
                           of_peak=statistics.median(g / p for g, p in zip(gflops_rounds, peaks[name])),
                           datasheet_tflops=datasheet,
                           of_datasheet=flops / median / 1e12 / datasheet if datasheet else None,
                           gemm_ceiling_gflops=None, of_gemm_ceiling=None, peak_mb=memory)
                if ceiling:
                    ceiling_rounds = [reference_flops['GEMM ceiling'] / t / 1e9 for t in ceiling]
                    row.update(gemm_ceiling_gflops=statistics.median(ceiling_rounds),
                               of_gemm_ceiling=statistics.median(g / c for g, c in zip(gflops_rounds, ceiling_rounds)))
                rows.append(row)
            del steps
            if cuda:
                torch.cuda.empty_cache()
    for name, note in notes.items():
        rows.append(dict(arch=arch, model=name, note=note))
    return rows


def _key(row: Dict) -> Tuple:
    return row['arch'], row['mode'], row['dtype'], row.get('batch')


def versus_best_peer(rows: List[Dict]) -> None:
    """Add ``vs_best_peer`` to our rows: our speed over the faster peer's, paired by round.

    The faster peer is the one with the higher median throughput. The ratio is the median over rounds
    of (peer time / our time) within the same round: both models ran back to back, so the machine's
    slow drifts (other tenants, clock changes) cancel, which a ratio of the two medians does not do.
    With ``--guard``, the guarded row gets ``guard_cost``: the median over rounds of its time over
    the unguarded wrapper row's.
    """
    for row in rows:
        if 'note' in row:
            continue
        if row['model'] == 'ours+guard':
            base = [r for r in rows if 'note' not in r and r['model'] == 'ours+wrapper' and _key(r) == _key(row)]
            if base:
                row['guard_cost'] = statistics.median(g / w for g, w in zip(row['times_s'], base[0]['times_s']))
                row['guard_cost_rounds'] = [g / w for g, w in zip(row['times_s'], base[0]['times_s'])]
            continue
        if row['model'] != 'ours':
            continue
        peers = [r for r in rows if 'note' not in r and r['model'] in MODELS and r['model'] != 'ours'
                 and _key(r) == _key(row)]
        if not peers:
            continue
        best = max(peers, key=lambda r: r['img_per_s'])
        row['best_peer'] = best['model']
        row['vs_best_peer'] = statistics.median(p / o for o, p in zip(row['times_s'], best['times_s']))
        row['vs_best_peer_rounds'] = [p / o for o, p in zip(row['times_s'], best['times_s'])]


def print_table(rows: List[Dict]):
    header = f"{'arch':<5}{'mode':<7}{'dtype':<15}{'batch':>6}  {'model':<14}{'img/s':>9}{'ms/iter':>10}" \
             f"{'GFLOP/s':>10}{'of peak':>9}{'of sheet':>10}{'of GEMMs':>10}{'peak MiB':>10}{'vs best peer':>16}"
    print(header)
    print('-' * len(header))
    for row in rows:
        if 'note' in row:
            print(f"{row['arch']:<5}{row['model']:<14}{row['note']}")
            continue
        if 'vs_best_peer' in row:
            ratio = f"{row['vs_best_peer']:.3f} {row['best_peer'][:4]}"
        elif 'guard_cost' in row:
            ratio = f"{row['guard_cost']:.3f} wrap"
        else:
            ratio = ''
        mem = f"{row['peak_mb']:.0f}" if row['peak_mb'] is not None else '-'
        # the GEMM ceiling is an fp32 inference reference: other rows get '-'
        of_gemms = f"{row['of_gemm_ceiling']:.2f}" if row['of_gemm_ceiling'] else '-'
        of_sheet = f"{row['of_datasheet']:.3f}" if row.get('of_datasheet') else '-'
        print(f"{row['arch']:<5}{row['mode']:<7}{row['dtype']:<15}{row.get('batch', ''):>6}  {row['model']:<14}"
              f"{row['img_per_s']:>9.1f}{row['ms_per_iter']:>10.1f}{row['gflops']:>10.1f}{row['of_peak']:>9.2f}"
              f"{of_sheet:>10}{of_gemms:>10}{mem:>10}{ratio:>16}")


def main(argv=None):
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    cuda = args.device == 'cuda'
    flags = cpu_flags()
    gpu, tf32 = {}, None
    if cuda:
        tf32 = set_tf32(not args.no_tf32)
        gpu = cuda_device_info()
    peak_dtype = torch.float32 if args.dtype == 'fp32' else DTYPES[args.dtype]
    peak_label = 'fp32' if not cuda else args.dtype
    peaks = {peak_label: matmul_gflops(peak_dtype if cuda else torch.float32, args.matmul_size, device=args.device)}
    rows = []
    for arch in args.arch:
        rows.extend(run_arch(arch, args, flags))
    peaks_after = {peak_label: matmul_gflops(peak_dtype if cuda else torch.float32, args.matmul_size,
                                             device=args.device)}
    how = 'torch.compile + freezing' if args.freeze else 'torch.compile' if args.compile else 'eager'
    where = f'{gpu["name"]} (datasheet dense bf16 {gpu["datasheet_bf16_tflops"] or "unknown"} TFLOP/s; {tf32})' \
        if cuda else f'{args.threads} threads'
    print(f'torch {torch.__version__}, {where}, batch {" ".join(map(str, args.batch))}, {args.img_size} px, '
          f'patch {args.patch_size}, {how}; square-matmul {peak_label} GFLOP/s {peaks[peak_label]:.1f} at the start, '
          f'{peaks_after[peak_label]:.1f} at the end ("of peak" and "of GEMMs" are medians of per-round ratios to '
          f'readings taken next to each timing; "of sheet" is against the datasheet rate)'
          + ('' if cuda else f'; AVX512-BF16: {has_bf16(flags)}'))
    versus_best_peer(rows)
    print_table(rows)
    result = dict(argv=sys.argv[1:] if argv is None else argv, torch=torch.__version__, python=platform.python_version(),
                  cpu=platform.processor() or platform.machine(), device=args.device, gpu=gpu, tf32=tf32,
                  threads=args.threads, batch=args.batch, dtype=args.dtype,
                  img_size=args.img_size, patch_size=args.patch_size, compile=args.compile or args.freeze,
                  freeze=args.freeze, avx512_bf16=has_bf16(flags),
                  matmul_gflops=peaks, matmul_gflops_after=peaks_after, rows=rows)
    out_dir = os.path.dirname(args.out)
    if out_dir:
        os.makedirs(out_dir, exist_ok=True)
    with open(args.out, 'w') as f:
        json.dump(result, f, indent=1)
    print(f'wrote {args.out}')
    return result

