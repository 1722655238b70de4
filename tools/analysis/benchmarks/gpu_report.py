"""One command that measures vit_plugin on a CUDA host and writes a report: ``make gpu-report``
(``tools/analysis/gpu_report.py``).

    python tools/analysis/gpu_report.py [--out-dir work_dirs/gpu_report] [--budget 570] [--smoke]

On a CUDA host it runs within ``--budget`` seconds of measurements (with start-up, 10 minutes on one
H100 by default) and writes ``report.md`` and ``report.json`` to ``--out-dir``:

1. the environment: GPU, driver, torch, CUDA, cuDNN, the stack's versions and where mmcv's operators
   come from;
2. the ``cuda``-marked tests (``pytest -m cuda``) and their results;
3. the benchmark table (tools/analysis/benchmark.py --device cuda) for ViT-S/16, B/16 and L/16 at
   224 px: inference and training, eager and compiled, bf16 autocast, ours against timm and
   mmpretrain, with model-FLOP utilisation against a matmul timed in the same rounds and against the
   GPU's datasheet rate;
4. for B/16 and L/16 training (bf16, fused AdamW) with and without activation checkpointing: the
   largest batch that fits, found with real steps, and the memory planner's estimate against the
   allocator's measured peak at one batch;
5. a Mask R-CNN ViT-B/16 (simple feature pyramid) training step and inference on the GPU, with the
   detector's operators on it;
6. the input pipeline's images/s per worker process, set against the GPU's training images/s: how
   many CPU cores it takes to feed the GPU.

Sections run in that order, each in its own share of the budget; whatever does not fit is reported
as not measured, with the command that measures it. The compiled benchmark rows come last (each model
compiles in the untimed warm-up).

On a host without CUDA it says so and runs a CPU smoke subset of the same sections (a tiny ViT, the
tiny shapes detector, a few images), in a minute or two; ``--smoke`` forces that subset on a CUDA host.
The test suite runs the subset (tests/benchmarks/test_gpu_report.py). It runs in a checkout: it reads the
configs under ``configs/`` and the tests under ``tests/``.
"""
import argparse
import json
import os
import os.path as osp
import subprocess
import sys
import tempfile
import time
import traceback
import xml.etree.ElementTree as ET

import torch

from benchmarks import benchmark_models, benchmark_pipeline
from benchmarks.child_process import CHECKOUT, child_failure
from benchmarks.device_checks import ClassifierTrainer, detection_steps, environment
from benchmarks.memory_measure import measure
from benchmarks.memory_planner import estimate, largest_batch, model_shape
from vit_plugin.evaluation.model_loading import load_config


REPO_ROOT = CHECKOUT
CONFIGS = osp.join(REPO_ROOT, 'configs')


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--out-dir', default='work_dirs/gpu_report', help='where report.md and report.json go')
    parser.add_argument('--budget', type=float, default=570,
                        help='seconds for the measurements (default 570: with start-up, 10 minutes in all)')
    parser.add_argument('--smoke', action='store_true', help='the CPU smoke subset, even on a CUDA host')
    parser.add_argument('--tests', nargs='+', default=['tests'],
                        help='test files or folders searched for `cuda`-marked tests (default: tests)')
    parser.add_argument('--arch', nargs='+', default=['s', 'b', 'l'], help='benchmark archs (default s b l)')
    parser.add_argument('--batch', type=int, default=128, help='benchmark batch on the GPU (default 128)')
    return parser.parse_args(argv)


class Budget:
    """Seconds left of the report's budget; each section gets a share of what remains."""

    def __init__(self, seconds: float):
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        return max(0.0, self.end - time.monotonic())

    def share(self, fraction: float, at_least: float = 0.0) -> float:
        return max(min(self.left(), at_least), self.left() * fraction)


def _main_in_child(module: str, args) -> list:
    """The command that runs ``module.main(args)`` in a fresh Python process."""
    return [sys.executable, '-c', f'import sys; from {module} import main; main(sys.argv[1:])', *args]


def _run(cmd, timeout, env=None):
    """Run a child process; (return code or None on timeout, stdout + stderr)."""
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=max(1, timeout), cwd=REPO_ROOT,
                              env=dict(os.environ, **(env or {})))
    except subprocess.TimeoutExpired as err:
        out = (err.stdout or b'').decode(errors='replace') if isinstance(err.stdout, bytes) else (err.stdout or '')
        return None, out
    return proc.returncode, proc.stdout + proc.stderr


# ------------------------------------------------------------------------------------------ sections
def section_environment(ctx) -> dict:
    return environment()


def cuda_test_files(paths) -> list:
    """The test files among ``paths`` (files or folders) that mark tests ``cuda``: collecting only them
    keeps the other test modules' imports (ONNX Runtime, scikit-learn...) out of the report."""
    files = []
    for path in paths:
        candidates = [path] if osp.isfile(path) else sorted(
            osp.join(root, name) for root, _, names in os.walk(path) for name in names
            if name.startswith('test_') and name.endswith('.py'))
        for name in candidates:
            with open(name, encoding='utf-8') as f:
                if 'mark.cuda' in f.read():
                    files.append(name)
    return files


def section_tests(ctx) -> dict:
    xml = osp.join(ctx.out_dir, 'cuda_tests.xml')
    files = cuda_test_files([osp.join(REPO_ROOT, p) if not osp.isabs(p) else p for p in ctx.args.tests])
    if not files:
        return dict(status='no test file marks tests `cuda`', command='', counts={}, cases=[])
    cmd = [sys.executable, '-m', 'pytest', '-m', 'cuda', *files, '-q', '-rA', '-p', 'no:cacheprovider',
           '--continue-on-collection-errors', f'--junitxml={xml}']
    code, output = _run(cmd, ctx.budget.share(0.3, at_least=60))
    if code is None:
        return dict(status='timeout', command=' '.join(cmd[2:]), output=output[-3000:])
    cases = []
    if osp.isfile(xml):
        for case in ET.parse(xml).getroot().iter('testcase'):
            outcome, reason = 'passed', ''
            for tag in ('failure', 'error', 'skipped'):
                node = case.find(tag)
                if node is not None:
                    outcome = {'failure': 'failed', 'error': 'error', 'skipped': 'skipped'}[tag]
                    reason = (node.get('message') or '').splitlines()[0][:200] if node.get('message') else ''
            cases.append(dict(test=f"{case.get('classname')}::{case.get('name')}", outcome=outcome,
                              seconds=float(case.get('time', 0)), reason=reason))
    counts = {k: sum(c['outcome'] == k for c in cases) for k in ('passed', 'failed', 'error', 'skipped')}
    shown = ' '.join(osp.relpath(f, REPO_ROOT) for f in files)
    return dict(command=f'python -m pytest -m cuda {shown}', exit_code=code, counts=counts, cases=cases,
                output=output[-3000:] if code not in (0, 5) else '')


def _benchmark(ctx, extra, timeout, name):
    out = osp.join(ctx.out_dir, f'{name}.json')
    shown = ' '.join(['python', 'tools/analysis/benchmark.py', *extra])
    if not ctx.cuda:  # the smoke subset: in this process, no start-up
        threads = torch.get_num_threads()
        try:
            result = benchmark_models.main([*extra, '--out', out])
        finally:
            torch.set_num_threads(threads)
        return dict(command=shown, status='ok', rows=result['rows'], gpu=None, tf32=None,
                    matmul=result.get('matmul_gflops'))
    # On the GPU each benchmark runs in its own process: a clean allocator, and a timeout.
    code, output = _run(_main_in_child('benchmarks.benchmark_models', [*extra, '--out', out]), timeout)
    if code != 0 or not osp.isfile(out):
        return dict(command=shown, status='timeout' if code is None else f'exit {code}', output=output[-3000:],
                    rows=[])
    with open(out) as f:
        result = json.load(f)
    return dict(command=shown, status='ok', rows=result['rows'], gpu=result.get('gpu'), tf32=result.get('tf32'),
                matmul=result.get('matmul_gflops'))


def section_benchmark(ctx, compiled: bool) -> dict:
    if ctx.cuda:
        base = ['--device', 'cuda', '--dtype', 'bf16', '--batch', str(ctx.args.batch), '--repeats', '5',
                '--iters', '5', '--warmup', '2']
    else:
        base = ['--arch', 'ti', '--layers', '2', '--img-size', '32', '--batch', '2', '--repeats', '2', '--iters', '1',
                '--warmup', '1', '--threads', '1', '--matmul-size', '256', '--no-memory', '--bf16', 'off']
    if not compiled:
        archs = ['--arch', *ctx.args.arch] if ctx.cuda else []
        return _benchmark(ctx, [*base, *archs, '--guard'], ctx.budget.share(0.5, at_least=60), 'benchmark_eager')
    if not ctx.cuda:
        return dict(parts=[dict(command='python tools/analysis/benchmark.py --device cuda --compile ...',
                                status='not run: CUDA only (compiling takes minutes on a CPU)')], rows=[])
    # Compiled: one child per arch (the smallest first), each with its share of what is left, so a
    # slow compile costs only its own rows.
    parts = []
    archs = ctx.args.arch
    for index, arch in enumerate(archs):
        timeout = ctx.budget.left() / (len(archs) - index) - 5
        args = [*base, '--compile', '--arch', arch]
        if timeout < 30:
            parts.append(dict(command=' '.join(['python', 'tools/analysis/benchmark.py', *args]),
                              status='not run: out of time', rows=[]))
            continue
        parts.append(_benchmark(ctx, args, timeout, f'benchmark_compiled_{arch}'))
    return dict(parts=parts, rows=[r for p in parts for r in p['rows']])


def section_memory(ctx) -> dict:
    rows = []
    if not ctx.cuda:
        config = osp.join(CONFIGS, 'vit_demo_digits.py')
        measured = measure(config, 8, with_cp=False)['peak']  # a child process: its own resident set
        planned = estimate(model_shape(load_config(config)), 8, with_cp=False, device='cpu').peak
        rows.append(dict(config='vit_demo_digits', with_cp=False, batch=8, measured_mib=measured / 2**20,
                         planned_mib=planned / 2**20, error=planned / measured - 1, largest=None, planned_largest=None))
        return dict(rows=rows, device='cpu')
    budget_bytes = torch.cuda.get_device_properties(0).total_memory
    share = ctx.budget.share(0.35, at_least=60)
    start = time.monotonic()
    for arch in ('b16', 'l16'):
        config = osp.join(CONFIGS, f'vit_{arch}_in21k.py')
        for with_cp in (False, True):
            if time.monotonic() - start > share:
                rows.append(dict(config=f'vit_{arch}_in21k', with_cp=with_cp, status='not run: out of time'))
                continue
            trainer = ClassifierTrainer(config, 'cuda', with_cp=with_cp, bf16=True)
            shape = model_shape(trainer.cfg)
            batch = 32
            measured = trainer.peak_bytes(batch)
            planned = estimate(shape, batch, with_cp=with_cp, bf16=True, device='cuda').peak
            planned_largest = largest_batch(shape, budget_bytes, with_cp=with_cp, bf16=True, device='cuda')
            found = trainer.largest_batch(planned_largest, max_probes=6, precision=0.1)
            rows.append(dict(config=f'vit_{arch}_in21k', with_cp=with_cp, batch=batch, measured_mib=measured / 2**20,
                             planned_mib=planned / 2**20, error=planned / measured - 1, largest=found['largest'],
                             probes=found['probes'], planned_largest=planned_largest))
            del trainer
            torch.cuda.empty_cache()
    return dict(rows=rows, device='cuda', memory_gib=budget_bytes / 2**30)


def section_detection(ctx) -> dict:
    if ctx.cuda:
        result = detection_steps(osp.join(CONFIGS, 'mask_rcnn_vit_b16_simplefpn_1x_coco.py'), 'cuda', img_size=1024,
                                 batch=2, steps=3, bf16=True)
        return dict(result, config='mask_rcnn_vit_b16_simplefpn_1x_coco', precision='bf16 autocast')
    result = detection_steps(osp.join(CONFIGS, 'mask_rcnn_vit_tiny_simplefpn_shapes.py'), 'cpu', img_size=64,
                             batch=1, steps=1)
    return dict(result, config='mask_rcnn_vit_tiny_simplefpn_shapes', precision='fp32')


def pipeline_images_per_s(num_images: int = 64, repeats: int = 3, size: int = 224, timeout: int = 600,
                          in_process: bool = False) -> dict:
    """Images per second of the ImageNet-21k training pipeline (``LoadAndInceptionCrop``) in one
    process on one core (:mod:`benchmarks.benchmark_pipeline` ``--pipelines ours``), in a
    child process with one thread, as in a data-loader worker, or ``in_process``."""
    with tempfile.TemporaryDirectory() as folder:
        out = osp.join(folder, 'pipeline.json')
        args = ['--pipelines', 'ours', '--num-images', str(num_images), '--repeats', str(repeats), '--size', str(size),
                '--out', out]
        if in_process:
            threads = torch.get_num_threads()
            try:
                benchmark_pipeline.main(args)
            finally:
                torch.set_num_threads(threads)
        else:
            code, output = _run(_main_in_child('benchmarks.benchmark_pipeline', args), timeout,
                                env=dict(OMP_NUM_THREADS='1'))
            if code != 0:
                raise RuntimeError(child_failure('the pipeline benchmark', output))
        with open(out) as f:
            result = json.load(f)
    return dict(images_per_s=result['pipelines']['ours']['images_per_s'], setting=result['setting'])


def section_pipeline(ctx) -> dict:
    num = 64 if ctx.cuda else 8
    result = pipeline_images_per_s(num_images=num, repeats=3 if ctx.cuda else 1,
                                   timeout=int(ctx.budget.share(0.5, at_least=60)), in_process=not ctx.cuda)
    # The GPU's training rate: our B/16 (or the smoke run's model), bf16, eager, from the benchmark.
    rows = [r for r in ctx.results.get('benchmark_eager', {}).get('rows', [])
            if r.get('model') == 'ours' and r.get('mode') == 'train']
    preferred = [r for r in rows if r['arch'] == 'b'] or rows
    if preferred:
        train = preferred[0]
        result.update(train_arch=train['arch'], train_dtype=train['dtype'], train_img_per_s=train['img_per_s'],
                      workers_needed=train['img_per_s'] / result['images_per_s'])
    result['cpus'] = os.cpu_count()
    return result


SECTIONS = [('environment', section_environment, 'Environment'),
            ('tests', section_tests, '`cuda` tests'),
            ('benchmark_eager', lambda ctx: section_benchmark(ctx, compiled=False), 'Benchmark, eager'),
            ('memory', section_memory, 'Memory: planner against the allocator, largest batch'),
            ('detection', section_detection, 'Mask R-CNN ViT step'),
            ('pipeline', section_pipeline, 'Input pipeline against the GPU'),
            ('benchmark_compiled', lambda ctx: section_benchmark(ctx, compiled=True), 'Benchmark, compiled')]


class Context:
    def __init__(self, args, cuda: bool):
        self.args, self.cuda = args, cuda
        self.out_dir = args.out_dir
        self.budget = Budget(args.budget)
        self.results = {}


# ------------------------------------------------------------------------------------------ report
def _fmt(value, spec='.2f', none='-'):
    return none if value is None else format(value, spec)


def _bench_table(rows) -> list:
    lines = ['| arch | mode | batch | model | img/s | ms/iter | of matmul peak | of datasheet | peak MiB | vs best peer |',
             '|---|---|---|---|---|---|---|---|---|---|']
    for r in rows:
        if 'note' in r:
            lines.append(f"| {r['arch']} | | | {r['model']} | {r['note']} | | | | | |")
            continue
        ratio = f"{r['vs_best_peer']:.3f} ({r['best_peer']})" if 'vs_best_peer' in r else \
            f"guard cost {r['guard_cost']:.3f}" if 'guard_cost' in r else ''
        lines.append(f"| {r['arch']} | {r['mode']} {r['dtype']} | {r.get('batch', '')} | {r['model']} | "
                     f"{r['img_per_s']:.1f} | {r['ms_per_iter']:.1f} | {r['of_peak']:.3f} | "
                     f"{_fmt(r.get('of_datasheet'), '.3f')} | {_fmt(r.get('peak_mb'), '.0f')} | {ratio} |")
    return lines


def render(report: dict) -> str:
    env = report['sections'].get('environment', {}).get('result', {})
    lines = ['# vit_plugin GPU report', '']
    if report['cuda']:
        gpu = env.get('gpu', {})
        lines.append(f"On {gpu.get('name')} (compute capability {gpu.get('capability')}, {gpu.get('memory_gib')} GiB), "
                     f"in {report['seconds']:.0f} s of a {report['budget']:.0f} s budget.")
    else:
        lines.append(f"**No CUDA device on this host** (`torch.cuda.is_available()` is False): this is the CPU smoke "
                     f"subset of the report (tiny models, a few images; the numbers say nothing about a GPU), "
                     f"run in {report['seconds']:.0f} s. On a CUDA host `make gpu-report` measures the real thing.")
    lines.append('')
    for key, _, title in SECTIONS:
        section = report['sections'].get(key)
        if section is None:
            continue
        lines += [f'## {title}', '']
        if section['status'] != 'ok':
            lines += [f"Not measured: {section['status']}.", '', '```', section.get('error', '')[-2000:], '```', '']
            continue
        result = section['result']
        lines += _render_section(key, result) + ['', f"({section['seconds']:.0f} s)", '']
    return '\n'.join(lines) + '\n'


def _render_section(key, result) -> list:
    if key == 'environment':
        gpu = result.get('gpu') or {}
        out = [f"- Python {result['python']}, torch {result['torch']}, CUDA {result.get('cuda')}, cuDNN {result.get('cudnn')}"
               f", {result['cpus']} CPUs",
               f"- GPU: {gpu.get('name', 'none')}" + (f", driver {result.get('driver')}, {result.get('gpu_count')} visible, "
                                                        f"datasheet dense bf16 {gpu.get('datasheet_bf16_tflops') or 'unknown'} TFLOP/s"
                                                        if gpu else ''),
               f"- mmcv's operators: {result['mmcv_ops']['description']}",
               f"- packages: {', '.join(result['packages'])}"]
        return out
    if key == 'tests':
        counts = result.get('counts', {})
        out = [f"`{result['command']}`: " + ', '.join(f'{v} {k}' for k, v in counts.items() if v), '',
               '| test | outcome | s | reason |', '|---|---|---|---|']
        out += [f"| {c['test']} | {c['outcome']} | {c['seconds']:.1f} | {c['reason']} |" for c in result.get('cases', [])]
        return out
    if key.startswith('benchmark'):
        parts = result.get('parts', [result])
        out = []
        for part in parts:
            out.append(f"`{part['command']}`" + ('' if part['status'] == 'ok' else f": {part['status']}"))
        return out + [''] + _bench_table(result['rows'])
    if key == 'memory':
        out = ['| config | with_cp | batch | measured peak MiB | planner MiB | planner error | largest batch (measured) '
               '| largest batch (planner) |', '|---|---|---|---|---|---|---|---|']
        for r in result['rows']:
            if 'status' in r:
                out.append(f"| {r['config']} | {r['with_cp']} | {r['status']} | | | | | |")
                continue
            out.append(f"| {r['config']} | {r['with_cp']} | {r['batch']} | {r['measured_mib']:.0f} | "
                       f"{r['planned_mib']:.0f} | {100 * r['error']:+.1f} % | {_fmt(r['largest'], 'd')} | "
                       f"{_fmt(r['planned_largest'], 'd')} |")
        return out
    if key == 'detection':
        return [f"{result['config']} at {result['img_size']} px, batch {result['batch']}, {result['precision']}: "
                f"training step {1e3 * result['train_s']:.0f} ms, inference {1e3 * result['infer_s']:.0f} ms, peak "
                f"{_fmt(result.get('peak_mib'), '.0f')} MiB, losses finite: {result['finite']}, predictions on "
                f"{result['outputs_device']}"]
    if key == 'pipeline':
        out = [f"LoadAndInceptionCrop pipeline: {result['images_per_s']:.0f} images/s per worker process (one core)."]
        if 'train_img_per_s' in result:
            out.append(f"Training ViT-{result['train_arch'].upper()}/16 (ours, {result['train_dtype']}, eager, from the "
                       f"benchmark) takes {result['train_img_per_s']:.1f} images/s: about "
                       f"{result['workers_needed']:.2f} worker processes (CPU cores) per device; this host has "
                       f"{result['cpus']} CPUs.")
        return out
    return ['```', json.dumps(result, indent=1)[:3000], '```']


def main(argv=None) -> dict:
    args = parse_args(argv)
    cuda = torch.cuda.is_available() and not args.smoke
    os.makedirs(args.out_dir, exist_ok=True)
    ctx = Context(args, cuda)
    start = time.monotonic()
    if not cuda:
        print('gpu_report: ' + ('--smoke: ' if torch.cuda.is_available() else 'no CUDA device on this host '
                                '(torch.cuda.is_available() is False): ') + 'running the CPU smoke subset.', flush=True)
    report = dict(cuda=cuda, budget=args.budget, sections={})
    for key, run, title in SECTIONS:
        begin = time.monotonic()
        print(f'gpu_report: {title} ...', flush=True)
        try:
            result = run(ctx)
            ctx.results[key] = result
            section = dict(status='ok', result=result)
        except Exception as err:  # one failing section must not cost the others
            section = dict(status=f'failed: {type(err).__name__}: {str(err).splitlines()[0][:300] if str(err) else ""}',
                           error=traceback.format_exc())
        section['seconds'] = time.monotonic() - begin
        report['sections'][key] = section
        print(f"gpu_report: {title}: {section['status']} ({section['seconds']:.0f} s)", flush=True)
    report['seconds'] = time.monotonic() - start
    with open(osp.join(args.out_dir, 'report.json'), 'w') as f:
        json.dump(report, f, indent=1, default=str)
    with open(osp.join(args.out_dir, 'report.md'), 'w') as f:
        f.write(render(report))
    print(f"gpu_report: wrote {osp.join(args.out_dir, 'report.md')} and report.json in {report['seconds']:.0f} s")
    return report

