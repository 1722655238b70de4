"""What the bad-input checks cost: the label check of a list file at ImageNet-21k size, and the
truncation / size / format checks of every image decode.

* **Label check** (``vit_plugin.datasets.compact_index.check_labels``, run each time a list file is
  indexed with ``num_classes``): on a synthetic list of ImageNet-21k's size (14,197,122 lines, written
  once into ``--data-dir`` by ``benchmark_dataset_index.py``'s generator and reused), in a fresh process
  with the index cache warm: seconds and memory of the check that passes (every label below
  ``num_classes``) and of the one that fails (``num_classes`` one below the largest label, which must
  find the first bad line), next to the time of opening the index itself. Memory: the peak of heap
  allocations during the check (``tracemalloc``, which numpy reports to) and the growth of the
  process's peak RSS (the mapped label array, 57 MB at full size, is file-backed page cache shared
  with the data-loader workers), and the growth of the process's resident memory during the first check
  (the label pages read from the page cache; USS counts them as private while this process alone maps
  them).
* **Decode checks**: realistic JPEGs (``benchmark_pipeline.py``'s generator, ImageNet-sized), each
  decoded at full resolution by ``cv2.imdecode`` (mmcv's ``LoadImageFromFile``: no checks) and by
  ``vit_plugin.datasets.decode.decode_image`` (header, size, mode and truncation checks, then the same
  OpenCV decode), and the checks alone (``inspect_image``), on one core, every image decoded by each
  in turn (so that load from other processes hits all alike). Reported: ms per image (median over
  repeats of the mean over images) and the overhead against ``cv2.imdecode`` in percent (median of
  the per-repeat ratios).

Full size (run on an otherwise idle machine)::

    python tools/analysis/benchmark_input_checks.py --out work_dirs/benchmark/input_checks.json
"""
import argparse
import functools
import json
import os
import os.path as osp
import statistics
import subprocess
import sys
import tempfile
import time

import cv2
import numpy as np

from benchmarks import benchmark_dataset_index, benchmark_pipeline
from benchmarks.child_process import child_env, child_failure
from benchmarks.peak_memory import heap_peak_bytes
from benchmarks.results import write_result
from benchmarks.timing import paired_rounds, time_calls
from vit_plugin.datasets.compact_index import ListFileError, ListFileIndex, check_labels
from vit_plugin.datasets.decode import decode_image, inspect_image


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--data-dir', default=osp.join('/tmp', 'vit_plugin_in21k_index_bench'),
                        help='where the synthetic list file is written (and reused). Default: '
                             '/tmp/vit_plugin_in21k_index_bench (shared with benchmark_dataset_index.py).')
    parser.add_argument('--num-lines', type=int, default=14_197_122, help='list lines. Default: ImageNet-21k.')
    parser.add_argument('--num-classes', type=int, default=21_841, help='classes of the list. Default: 21841.')
    parser.add_argument('--label-repeats', type=int, default=5, help='timed label checks (median). Default: 5.')
    parser.add_argument('--num-images', type=int, default=64, help='JPEGs decoded. Default: 64.')
    parser.add_argument('--long-side', type=int, default=500, help='JPEG long side in px. Default: 500.')
    parser.add_argument('--repeats', type=int, default=7, help='timed decode passes (median). Default: 7.')
    parser.add_argument('--seed', type=int, default=0)
    parser.add_argument('--skip-labels', action='store_true', help='only the decode checks')
    parser.add_argument('--skip-decode', action='store_true', help='only the label check')
    parser.add_argument('--out', help='write the results as JSON here.')
    parser.add_argument('--measure-labels', help=argparse.SUPPRESS)  # internal: the child run
    return parser.parse_args(argv)


# ------------------------------------------------------------------------------------ label check
def _timed_peak(func, repeats: int):
    """(median seconds, largest tracemalloc peak in MiB) of ``func()`` over ``repeats`` calls."""
    times, peaks = [], []
    for _ in range(repeats):
        seconds, peak = heap_peak_bytes(lambda: time_calls(func, 1)[0])
        times.append(seconds)
        peaks.append(peak / 2**20)
    return statistics.median(times), max(peaks)


def measure_labels(list_file: str, num_classes: int, repeats: int) -> dict:
    """In this (fresh) process: open the index, then time the passing and the failing label check."""
    memory = benchmark_dataset_index.memory
    ListFileIndex.open(list_file)  # make sure the cache exists (not timed)
    start = time.perf_counter()
    index = ListFileIndex.open(list_file)
    open_s = time.perf_counter() - start
    labels = index.labels
    before = memory()
    check_labels(labels, num_classes, list_file)  # the first check: pages come in
    after = memory()
    passing_s, passing_heap = _timed_peak(lambda: check_labels(labels, num_classes, list_file), repeats)
    top = int(labels.max())
    message = []

    def failing():
        try:
            check_labels(labels, top, list_file)
        except ListFileError as err:
            message[:] = [str(err)]

    failing_s, failing_heap = _timed_peak(failing, repeats)
    return dict(lines=len(labels), open_index_s=open_s, check_s=passing_s, check_heap_peak_mib=passing_heap,
                failing_check_s=failing_s, failing_check_heap_peak_mib=failing_heap,
                first_check_rss_growth_mib=after['rss'] - before['rss'],
                first_check_uss_growth_mib=after['uss'] - before['uss'], labels_mib=labels.nbytes / 2**20,
                failing_message=message[0][:200] if message else None)


def label_check(args) -> dict:
    index_bench = benchmark_dataset_index
    start = time.perf_counter()
    list_file = index_bench.write_list_file(args.data_dir, args.num_lines, args.num_classes, args.seed)
    print(f'list file: {list_file} ({args.num_lines:,} lines; written or checked in '
          f'{time.perf_counter() - start:.1f} s)', flush=True)
    cmd = [sys.executable, '-m', 'benchmarks.benchmark_input_checks', '--measure-labels', list_file,
           '--num-classes', str(args.num_classes), '--label-repeats', str(args.label_repeats)]
    env = child_env()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode:
        raise RuntimeError(child_failure('label check measurement', proc.stderr))
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    print(f"label check of {result['lines']:,} labels ({result['labels_mib']:.0f} MiB, memory-mapped): "
          f"{result['check_s'] * 1e3:.1f} ms, heap peak {result['check_heap_peak_mib']:.2f} MiB; a failing "
          f"check (finds the line): {result['failing_check_s'] * 1e3:.1f} ms, heap peak "
          f"{result['failing_check_heap_peak_mib']:.1f} MiB; the first check adds {result['first_check_rss_growth_mib']:.0f} "
          f"MiB RSS (the mapped labels); opening the cached index: "
          f"{result['open_index_s'] * 1e3:.1f} ms (median of {args.label_repeats})")
    return result


# ----------------------------------------------------------------------------------- decode checks
def decode_checks(args) -> dict:
    cv2.setNumThreads(1)
    pipeline_bench = benchmark_pipeline
    with tempfile.TemporaryDirectory(prefix='jpegs_') as folder:
        paths = pipeline_bench.make_jpegs(folder, args.num_images, args.long_side, 90, args.seed)
        blobs = []
        for path in paths:
            with open(path, 'rb') as f:
                blobs.append((path, f.read()))
    funcs = {
        'cv2.imdecode (no checks)': lambda item: cv2.imdecode(np.frombuffer(item[1], np.uint8), cv2.IMREAD_COLOR),
        'decode_image (checked)': lambda item: decode_image(item[1], item[0]),
        'inspect_image (checks only)': lambda item: inspect_image(item[1], item[0]),
    }
    for item in blobs:  # warm-up
        for func in funcs.values():
            func(item)
    times = {name: [] for name in funcs}
    for _ in range(args.repeats):
        total = dict.fromkeys(funcs, 0.0)
        for item in blobs:  # every image by each function in turn
            one = paired_rounds({name: functools.partial(func, item) for name, func in funcs.items()}, 1)
            for name in funcs:
                total[name] += one[name][0]
        for name in funcs:
            times[name].append(total[name] / len(blobs))
    base = times['cv2.imdecode (no checks)']
    rows = {}
    for name, ts in times.items():
        rows[name] = dict(ms_per_image=1e3 * statistics.median(ts),
                          vs_unchecked=statistics.median(t / b for t, b in zip(ts, base)))
    mean_kb = sum(len(b) for _, b in blobs) / len(blobs) / 1024
    print(f'{args.num_images} JPEGs of {args.long_side}x{round(args.long_side * 3 / 4)} ({mean_kb:.0f} KiB), '
          f'full-resolution decode, one core, median of {args.repeats} (same run):')
    for name, row in rows.items():
        print(f"  {name:28s} {row['ms_per_image']:8.3f} ms/image   {100 * (row['vs_unchecked'] - 1):+6.1f} % "
              f'vs cv2.imdecode' if name != 'cv2.imdecode (no checks)' else
              f"  {name:28s} {row['ms_per_image']:8.3f} ms/image")
    return dict(num_images=args.num_images, long_side=args.long_side, mean_file_kb=mean_kb, repeats=args.repeats,
                rows=rows)


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.measure_labels:
        print(json.dumps(measure_labels(args.measure_labels, args.num_classes, args.label_repeats)))
        return {}
    result = {'cpu_count': os.cpu_count()}
    if not args.skip_labels:
        result['label_check'] = label_check(args)
    if not args.skip_decode:
        result['decode'] = decode_checks(args)
    if args.out:
        write_result(result, args.out)
    return result


if __name__ == '__main__':
    main()
