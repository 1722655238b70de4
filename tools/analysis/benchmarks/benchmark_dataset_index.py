"""Start-up time and memory of the ImageNet-21k list-file dataset: vit_plugin's index vs mmpretrain's.

A synthetic list file of ImageNet-21k's size (14,197,122 lines, 21,841 wnid classes with long-tailed
per-class counts, paths like ``n01440764/n01440764_10026.JPEG``) is written once into ``--data-dir``
(``meta/train.txt``, plus an empty ``train/`` image folder) and reused. Each measurement runs in a fresh
process, which builds the dataset exactly as the imagenet21k config does (``ann_file='meta/train.txt'``,
``data_prefix='train'``) with an empty pipeline, then iterates a DataLoader with ``--workers`` workers
over random samples and a collate that returns the sample indices, so the index is measured and not
image decoding. Reported per run: start-up (seconds to build the dataset), the main process's RSS and
USS growth while building it, its peak RSS growth, and each worker's PSS and USS after ``--batches``
batches (``/proc/<pid>/smaps_rollup``; PSS shares pages among the processes that map them).

* ``vit_plugin`` (``vit_plugin.ImageNet21k``): cold = no ``<ann_file>.index`` cache yet; warm = cache
  present (every later run).
* ``mmpretrain`` (``mmpretrain.datasets.ImageNet21k``): no cache, one run. Its parser keeps a dict per
  line; when its peak, projected from a run on the first ``--probe-lines`` lines, would exceed
  ``--baseline-max-gib``, it runs on the largest prefix of the file that fits, and vit_plugin is measured
  on that prefix as well for a like-for-like row. ``--skip-baseline`` leaves it out.

Full size (about 570 MB of list file; run on an otherwise idle machine)::

    python tools/analysis/benchmark_dataset_index.py --data-dir /tmp/in21k_index_bench \\
        --out work_dirs/benchmark/dataset_index.json
"""
import argparse
import json
import os
import os.path as osp
import subprocess
import sys
import time
from typing import Dict, List, Optional

import numpy as np

from benchmarks.child_process import child_env, child_failure
from benchmarks.peak_memory import max_rss_mib
from benchmarks.results import write_result
from vit_plugin.compat import torch as torch_compat
from vit_plugin.datasets.checked import ImageNet21k as OurImageNet21k

IN21K_IMAGES = 14_197_122
IN21K_CLASSES = 21_841
LIST_FILE = osp.join('meta', 'train.txt')


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--data-dir', default=osp.join('/tmp', 'vit_plugin_in21k_index_bench'),
                        help='where the synthetic data root is written (and reused). '
                             'Default: /tmp/vit_plugin_in21k_index_bench.')
    parser.add_argument('--num-lines', type=int, default=IN21K_IMAGES,
                        help=f'lines of the list file. Default: {IN21K_IMAGES} (ImageNet-21k).')
    parser.add_argument('--num-classes', type=int, default=IN21K_CLASSES,
                        help=f'classes (wnids). Default: {IN21K_CLASSES}.')
    parser.add_argument('--workers', type=int, default=4, help='DataLoader workers. Default: 4.')
    parser.add_argument('--batches', type=int, default=20, help='batches read before the workers are '
                        'measured. Default: 20.')
    parser.add_argument('--batch-size', type=int, default=256, help='Default: 256.')
    parser.add_argument('--skip-baseline', action='store_true', help="do not measure mmpretrain's parser.")
    parser.add_argument('--baseline-max-gib', type=float, default=16.0,
                        help="largest projected peak RSS growth of mmpretrain's parser to run at full "
                             'size; above it, a prefix of the file is used. Default: 16.')
    parser.add_argument('--probe-lines', type=int, default=200_000,
                        help='lines of the probe run that projects the baseline peak. Default: 200000.')
    parser.add_argument('--seed', type=int, default=0, help='seed of the synthetic list. Default: 0.')
    parser.add_argument('--out', help='write the results as JSON here.')
    parser.add_argument('--measure', help=argparse.SUPPRESS)  # internal: one measurement (a child run)
    parser.add_argument('--list-file', help=argparse.SUPPRESS)
    return parser.parse_args(argv)


# ----------------------------------------------------------------------------- synthetic list file
def class_counts(num_lines: int, num_classes: int, seed: int = 0) -> np.ndarray:
    """Per-class image counts summing to ``num_lines``: long-tailed like ImageNet-21k (log-normal; at full
    size 13 to about 2,260 images per class, 650 on average)."""
    rng = np.random.default_rng(seed)
    weights = np.clip(rng.lognormal(mean=0.0, sigma=0.8, size=num_classes), 0.02, 4.6)
    raw = weights / weights.sum() * num_lines
    counts = np.floor(raw).astype(np.int64)
    counts[np.argsort(counts - raw)[:num_lines - counts.sum()]] += 1  # largest remainders
    return counts


def wnids(num_classes: int, seed: int = 0) -> List[str]:
    """Sorted, distinct WordNet-style ids ``n0xxxxxxx``."""
    rng = np.random.default_rng(seed + 1)
    ids = np.sort(rng.choice(np.arange(1_000_000, 15_300_000), size=num_classes, replace=False))
    return [f'n{i:08d}' for i in ids]


def write_list_file(root: str, num_lines: int, num_classes: int, seed: int = 0) -> str:
    """Write ``<root>/meta/train.txt`` (and an empty ``<root>/train``) unless the same one is there.

    Returns:
        str: The list file's path.
    """
    path = osp.join(root, LIST_FILE)
    spec = {'num_lines': num_lines, 'num_classes': num_classes, 'seed': seed}
    spec_path = path + '.spec.json'
    os.makedirs(osp.join(root, 'train'), exist_ok=True)
    os.makedirs(osp.dirname(path), exist_ok=True)
    if osp.exists(path) and osp.exists(spec_path):
        with open(spec_path) as f:
            if json.load(f) == spec:
                return path
    counts = class_counts(num_lines, num_classes, seed)
    names = wnids(num_classes, seed)
    rng = np.random.default_rng(seed + 2)
    # Image numbers increase within a class with gaps, like ImageNet's n01440764_10026.
    gaps = rng.integers(1, 40, size=num_lines)
    tmp = path + f'.tmp{os.getpid()}'
    with open(tmp, 'w') as f:
        start = 0
        for label, (wnid, count) in enumerate(zip(names, counts)):
            numbers = np.cumsum(gaps[start:start + count]) + 1
            start += count
            f.write(''.join(f'{wnid}/{wnid}_{k}.JPEG {label}\n' for k in numbers.tolist()))
    os.replace(tmp, path)
    with open(spec_path, 'w') as f:
        json.dump(spec, f)
    for stale in (path + '.index',):
        if osp.exists(stale):
            os.unlink(stale)
    return path


def write_prefix(path: str, num_lines: int) -> str:
    """``path``'s first ``num_lines`` lines as ``<stem>_first<n>.txt`` next to it (reused)."""
    out = f'{osp.splitext(path)[0]}_first{num_lines}.txt'
    if osp.exists(out) and osp.getmtime(out) >= osp.getmtime(path):
        return out
    tmp = out + f'.tmp{os.getpid()}'
    with open(path, 'rb') as src, open(tmp, 'wb') as dst:
        for _, line in zip(range(num_lines), src):
            dst.write(line)
    os.replace(tmp, out)
    return out


# ----------------------------------------------------------------------------- one measurement
def memory(pid='self') -> Dict[str, float]:
    """RSS, PSS and USS (private clean + dirty) of a process in MiB, from smaps_rollup."""
    fields = {}
    with open(f'/proc/{pid}/smaps_rollup') as f:
        for line in f:
            parts = line.split()
            if len(parts) == 3 and parts[2] == 'kB':
                fields[parts[0].rstrip(':')] = int(parts[1]) / 1024
    return {'rss': fields['Rss'], 'pss': fields['Pss'],
            'uss': fields['Private_Clean'] + fields['Private_Dirty']}


def collate_indices(batch):
    """The samples' indices (the benchmark reads records, not images)."""
    return [info['sample_idx'] for info in batch]


def measure(impl: str, list_file: str, workers: int, batches: int, batch_size: int, seed: int) -> dict:
    """Build one dataset in this process and read batches with ``workers`` workers."""
    import torch
    from mmpretrain.datasets import ImageNet21k as MMPretrainImageNet21k
    from torch.utils.data import DataLoader, RandomSampler

    cls = {'vit_plugin': OurImageNet21k, 'mmpretrain': MMPretrainImageNet21k}[impl]
    root = osp.dirname(osp.dirname(list_file))
    before = memory()
    peak_before = max_rss_mib()
    start = time.perf_counter()
    dataset = cls(data_root=root, ann_file=osp.relpath(list_file, root), data_prefix='train', pipeline=[])
    startup = time.perf_counter() - start
    after = memory()
    peak = max_rss_mib()
    first = dataset.get_data_info(0)
    result = {
        'impl': impl, 'num_lines': len(dataset), 'startup_s': startup,
        'main_rss_growth_mib': after['rss'] - before['rss'], 'main_uss_growth_mib': after['uss'] - before['uss'],
        'main_peak_rss_growth_mib': max(peak - peak_before, after['rss'] - before['rss']),
        'main_rss_before_mib': before['rss'],
        'first_record': {'img_path': osp.relpath(first['img_path'], root), 'gt_label': first['gt_label']},
    }
    if workers:
        sampler = RandomSampler(dataset, generator=torch.Generator().manual_seed(seed))
        loader = DataLoader(dataset, batch_size=batch_size, sampler=sampler, num_workers=workers,
                            collate_fn=collate_indices)
        it = iter(loader)
        seen = sum(len(next(it)) for _ in range(batches))
        pids = torch_compat.dataloader_worker_pids(it)  # the live worker processes of this iterator
        per_worker = [memory(pid) for pid in pids]
        del it
        result.update(samples_read=seen, worker_pss_mib=[m['pss'] for m in per_worker],
                      worker_uss_mib=[m['uss'] for m in per_worker])
    return result


def run_child(args, impl: str, list_file: str, workers: Optional[int] = None) -> dict:
    """One measurement in a fresh interpreter (memory numbers of one dataset only)."""
    cmd = [sys.executable, '-m', 'benchmarks.benchmark_dataset_index', '--measure', impl,
           '--list-file', list_file, '--workers', str(args.workers if workers is None else workers),
           '--batches', str(args.batches), '--batch-size', str(args.batch_size), '--seed', str(args.seed)]
    env = child_env()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode:
        raise RuntimeError(child_failure(f'measurement {impl} on {list_file}', proc.stderr))
    return json.loads(proc.stdout.strip().splitlines()[-1])


# ----------------------------------------------------------------------------- report
def _fmt(value, digits=1):
    return '-' if value is None else f'{value:.{digits}f}'


def table(rows: List[dict]) -> str:
    head = ('implementation', 'lines', 'run', 'start-up s', 'main RSS +MiB', 'main USS +MiB',
            'main peak +MiB', 'worker PSS MiB (max)', 'worker USS MiB (max)')
    lines = [' | '.join(head), ' | '.join('-' * len(h) for h in head)]
    for r in rows:
        lines.append(' | '.join([
            r['impl'], str(r['num_lines']), r['run'], _fmt(r['startup_s'], 2), _fmt(r['main_rss_growth_mib']),
            _fmt(r['main_uss_growth_mib']), _fmt(r['main_peak_rss_growth_mib']),
            _fmt(max(r['worker_pss_mib'])) if r.get('worker_pss_mib') else '-',
            _fmt(max(r['worker_uss_mib'])) if r.get('worker_uss_mib') else '-']))
    return '\n'.join(lines)


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.measure:
        print(json.dumps(measure(args.measure, args.list_file, args.workers, args.batches, args.batch_size,
                                 args.seed)))
        return {}

    start = time.perf_counter()
    list_file = write_list_file(args.data_dir, args.num_lines, args.num_classes, args.seed)
    print(f'list file: {list_file} ({args.num_lines} lines, {osp.getsize(list_file) / 2**20:.0f} MiB, '
          f'written or checked in {time.perf_counter() - start:.1f} s)', flush=True)
    rows, notes = [], []

    def ours(path):
        cache = path + '.index'
        if osp.exists(cache):
            os.unlink(cache)
        for run in ('cold', 'warm'):
            rows.append({**run_child(args, 'vit_plugin', path), 'run': run})
            print(table(rows[-1:]).splitlines()[-1], flush=True)

    ours(list_file)
    if not args.skip_baseline:
        baseline_file, limit_mib = list_file, args.baseline_max_gib * 1024
        if args.num_lines > args.probe_lines:
            probe = run_child(args, 'mmpretrain', write_prefix(list_file, args.probe_lines), workers=0)
            per_line = probe['main_peak_rss_growth_mib'] / args.probe_lines
            projected = per_line * args.num_lines
            notes.append(f"mmpretrain's peak RSS growth: {probe['main_peak_rss_growth_mib']:.0f} MiB at "
                         f'{args.probe_lines} lines, projected {projected / 1024:.1f} GiB at {args.num_lines}.')
            if projected > limit_mib:
                lines = int(limit_mib / per_line) // 100_000 * 100_000 or args.probe_lines
                baseline_file = write_prefix(list_file, lines)
                notes.append(f'That exceeds --baseline-max-gib {args.baseline_max_gib:g}: mmpretrain (and '
                             f'vit_plugin again, for comparison) measured on the first {lines} lines.')
                ours(baseline_file)
        rows.append({**run_child(args, 'mmpretrain', baseline_file), 'run': 'no cache'})
        print(table(rows[-1:]).splitlines()[-1], flush=True)

    report = table(rows)
    print('\n' + report)
    for note in notes:
        print(note)
    result = {'num_lines': args.num_lines, 'num_classes': args.num_classes, 'workers': args.workers,
              'batches': args.batches, 'batch_size': args.batch_size, 'seed': args.seed, 'rows': rows,
              'notes': notes, 'cpu_count': os.cpu_count()}
    if args.out:
        write_result(result, args.out)
    return result


if __name__ == '__main__':  # the measuring child processes run this module (run_child)
    main()
