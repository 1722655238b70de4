"""Samples per second per core of training input read from tar shards, against the folder layout, the
``webdataset`` library and the same shards over HTTP; and the shard index's build time and memory.

**Data** (written once into ``--data-dir`` and reused while the settings are the same): ``--num-images``
ImageNet-like JPEGs (:func:`benchmarks.benchmark_pipeline.make_jpegs`: cuts of real photos,
``--long-side`` x 3/4 of it, a quarter portrait, quality ``--quality``; 500 px at 98 gives about 100 KiB
per file, ImageNet's average), each with a random class among the first ``--num-classes`` synsets of
fall11, stored twice:

* ``folder/``: ``train/<synset>/<synset>_<n>.JPEG`` plus the list file ``meta/train.txt``, as
  ``configs/_base_/datasets/imagenet21k.py`` reads them;
* ``shards/``: timm's WebDataset layout (``imagenet22k-train-NNNN.tar`` of ``--shard-size`` samples in a
  random order, ``.jpg`` + ``.cls`` + ``.json`` per sample, and ``_info.json``), as
  ``configs/_base_/datasets/imagenet21k_wds.py`` reads them.

**Readers**, each one pass over the same ``--samples`` samples per round, from the bytes to the packed
tensor through the same pipeline (the ``train_pipeline`` of the imagenet21k config:
``vit_plugin.LoadAndInceptionCrop(224, crop_ratio_range=(0.05, 1))``, ``RandomFlip``, ``PackInputs``):

* ``folder``: ``vit_plugin.ImageNet21k`` with the list file, in a random order (the config's
  ``InfiniteSampler``);
* ``shards``: ``vit_plugin.TarShardDataset`` in the order of ``vit_plugin.BlockShuffleSampler``
  (``--block-size``, ``--mix-blocks``: the shard config's);
* ``webdataset``: the ``webdataset`` library's ``WebDataset`` reading the shards in order, the same
  pipeline applied to each sample's ``jpg`` bytes;
* ``remote``: ``TarShardDataset`` on the shards served by :func:`~benchmarks.loopback_http.serve_folder`
  on 127.0.0.1 with ``--delay-ms`` added per request, in the ``shards`` order, read-ahead on (the
  reader's defaults), starting every pass with an empty chunk cache (cold).

Everything runs in this process pinned to one core (``os.sched_setaffinity``, every thread: the remote
reader's read-ahead threads count), with one torch and one OpenCV thread; the HTTP server runs in a
child process on the other cores. The readers take turns within a round (:func:`~.timing.paired_rounds`,
rotated), and each ratio is the median of the per-round ratios. Local files are in the page cache after
the first pass, so the local rows are the CPU cost per sample.

**Index build** (``--index-samples`` over ``--index-shards`` shards in timm's layout with tiny members,
so that the scan of the tar headers is what is measured): :meth:`TarShardIndex.open` with
``rebuild=True``, with every core and with one, at the full size and on the first half of the shards,
and once over the image shards; each build in a process forked from one fresh interpreter (the same
memory at every start). Reported: seconds, the builder's peak RSS growth, the largest private memory
(USS) of a worker process, and the peak of the builder's growth plus its workers' USS (the memory the
build adds), sampled every 20 ms. Per million samples is the slope between the two sizes (a straight
line through both; the fixed cost is its intercept): an extrapolation, printed only where the fit means
something (:func:`fit_problems`: a positive slope, a fixed cost that is not negative, more processes
faster than one); otherwise the report says why not.

Example (the numbers of docs/benchmarks.md#tar-shards)::

    python tools/analysis/benchmark_shards.py --out work_dirs/benchmark/shards.json
"""
import argparse
import contextlib
import io
import json
import multiprocessing
import os
import os.path as osp
import platform
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from typing import Callable, Dict, Iterator, List, NamedTuple, Optional, Sequence, Set, Tuple

import cv2
import numpy as np

from vit_plugin import label_spaces
from benchmarks.benchmark_pipeline import make_jpegs
from benchmarks.child_process import child_env, child_failure
from benchmarks.loopback_http import serve_folder
from benchmarks.results import write_result
from benchmarks.timing import paired_rounds
from vit_plugin.datasets import BlockShuffleSampler, TarShardDataset
from vit_plugin.datasets.checked import ImageNet21k
from vit_plugin.datasets.decode import inspect_image
from vit_plugin.datasets.shards import ShardReader
from vit_plugin.datasets.tar_index import LabelRule, TarShardIndex, resolve_shards

READERS = ('folder', 'shards', 'webdataset', 'remote')
#: The ``train_pipeline`` of configs/_base_/datasets/imagenet21k.py (and so of the shard configs).
PIPELINE = (dict(type='vit_plugin.LoadAndInceptionCrop', scale=224, crop_ratio_range=(0.05, 1.0)),
            dict(type='RandomFlip', prob=0.5, direction='horizontal'),
            dict(type='PackInputs'))
PREFIX, SPLIT = 'imagenet22k', 'train'
#: Where the images are written by default (benchmark_resume reads the same ones).
DEFAULT_DATA_DIR = osp.join(tempfile.gettempdir(), 'vit_plugin_shards_bench')
LIST_FILE = osp.join('meta', 'train.txt')
_SPEC = 'spec.json'
_POLL_S = 0.02


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    add_image_args(parser, 8192)
    parser.add_argument('--samples', type=int, default=None,
                        help='samples read per reader and round: the first of the epoch order. Default: one '
                             'window of the sampler (--block-size x --mix-blocks), or all when fewer.')
    parser.add_argument('--rounds', type=int, default=5, help='timed rounds (median). Default: 5.')
    parser.add_argument('--warmup', type=int, default=1, help='untimed rounds first. Default: 1.')
    parser.add_argument('--readers', nargs='+', default=list(READERS), choices=READERS)
    parser.add_argument('--delay-ms', type=float, default=20.0,
                        help='latency added to every HTTP request of the remote reader. Default: 20.')
    parser.add_argument('--chunk-mib', type=float, default=None,
                        help="the remote reader's chunk size in MiB. Default: ShardReader's.")
    parser.add_argument('--readahead', type=int, default=None,
                        help="the remote reader's chunks of read-ahead. Default: ShardReader's.")
    parser.add_argument('--block-size', type=int, default=256, help='BlockShuffleSampler. Default: 256.')
    parser.add_argument('--mix-blocks', type=int, default=16, help='BlockShuffleSampler. Default: 16.')
    parser.add_argument('--core', type=int, default=None,
                        help='the core the readers run on. Default: the last one this process may use.')
    parser.add_argument('--index-samples', type=int, default=200_000,
                        help='samples of the index build (0: no index build). Default: 200000.')
    parser.add_argument('--index-shards', type=int, default=64, help='their shards. Default: 64.')
    parser.add_argument('--index-scale', type=int, nargs='+', default=None, metavar='SHARDS',
                        help='only measure the cost of indexing per shard, local and over HTTP, at these '
                             'shard counts (e.g. 8 32 64; a line fit through them): see measure_index_scale.')
    parser.add_argument('--scale-samples', type=int, default=100, help='samples per shard of --index-scale. '
                        'Default: 100.')
    parser.add_argument('--scale-member-kib', type=int, default=32, help="each sample's .jpg in KiB for "
                        '--index-scale (random bytes: the scan reads headers only). Default: 32.')
    parser.add_argument('--out', default=None, help='write the results as JSON here.')
    # internal: the index builds, in a fresh interpreter (run_index_child)
    parser.add_argument('--measure-index', help=argparse.SUPPRESS)  # [[folder, shards, workers], ...] as JSON
    args = parser.parse_args(argv)
    if args.num_images < 1 or args.shard_size < 1 or args.index_shards < 2 and args.index_samples:
        parser.error('--num-images and --shard-size must be positive, --index-shards at least 2')
    return args


# ----------------------------------------------------------------------------------------------- data
def add_image_args(parser: argparse.ArgumentParser, num_images: int) -> None:
    """The options of :func:`write_images` (shared with benchmark_resume)."""
    parser.add_argument('--data-dir', default=DEFAULT_DATA_DIR,
                        help='where the images, shards and index shards are written (and reused). '
                             'Default: <tmp>/vit_plugin_shards_bench.')
    parser.add_argument('--num-images', type=int, default=num_images, help=f'JPEGs. Default: {num_images}.')
    parser.add_argument('--long-side', type=int, default=500, help='their long side in px. Default: 500.')
    parser.add_argument('--quality', type=int, default=98, help='JPEG quality. Default: 98 (about 100 KiB).')
    parser.add_argument('--num-classes', type=int, default=100, help='classes. Default: 100.')
    parser.add_argument('--shard-size', type=int, default=1024, help='samples per shard. Default: 1024.')
    parser.add_argument('--seed', type=int, default=0)


class ImageData(NamedTuple):
    """The benchmark's images as a folder with a list file and as shards, and their labels."""
    folder: str  # data_root of vit_plugin.ImageNet21k (meta/train.txt, train/)
    shards: str  # data_root of vit_plugin.TarShardDataset (the .tar files and _info.json)
    shard_names: Tuple[str, ...]
    labels: Tuple[int, ...]  # in the list file's order
    mean_kib: float


def _reuse(root: str, spec: dict) -> Optional[dict]:
    """The saved description of ``root`` when it was written with ``spec``, else None."""
    path = osp.join(root, _SPEC)
    if osp.exists(path):
        with open(path) as f:
            saved = json.load(f)
        if saved.get('spec') == spec:
            return saved
    return None


def _save_spec(root: str, spec: dict, **found) -> dict:
    saved = dict(spec=spec, **found)
    tmp = osp.join(root, _SPEC + f'.tmp{os.getpid()}')
    with open(tmp, 'w') as f:
        json.dump(saved, f)
    os.replace(tmp, osp.join(root, _SPEC))
    return saved


def _add(tf: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mtime = len(data), 0
    tf.addfile(info, io.BytesIO(data))


def write_info(folder: str, names: Sequence[str], counts: Sequence[int]) -> None:
    """timm's ``_info.json`` split file for the train split."""
    info = {'name': PREFIX, 'splits': {SPLIT: {'name': SPLIT, 'num_samples': int(sum(counts)),
                                                'filenames': list(names),
                                                'shard_lengths': [int(c) for c in counts]}}}
    with open(osp.join(folder, '_info.json'), 'w') as f:
        json.dump(info, f)


def write_images(root: str, num_images: int, long_side: int, quality: int, num_classes: int, shard_size: int,
                 seed: int = 0) -> ImageData:
    """Write (or reuse) the benchmark's JPEGs as a folder with a list file and as timm-layout shards.

    Returns:
        ImageData: Where they are, and the labels.
    """
    spec = dict(num_images=num_images, long_side=long_side, quality=quality, num_classes=num_classes,
                shard_size=shard_size, seed=seed)
    folder, shards = osp.join(root, 'folder'), osp.join(root, 'shards')
    saved = _reuse(root, spec)
    if saved is None:
        for stale in (folder, shards, osp.join(root, _SPEC)):
            if osp.isdir(stale):
                shutil.rmtree(stale)
            elif osp.exists(stale):
                os.unlink(stale)
        saved = _write_images(root, folder, shards, spec)
    return ImageData(folder, shards, tuple(saved['shard_names']), tuple(saved['labels']), saved['mean_kib'])


def _write_images(root: str, folder: str, shards: str, spec: dict) -> dict:
    rng = np.random.default_rng(spec['seed'] + 1)
    synsets = label_spaces.synsets('fall11')[:spec['num_classes']]
    os.makedirs(osp.join(folder, 'meta'))
    os.makedirs(shards)
    labels = [int(x) for x in rng.integers(spec['num_classes'], size=spec['num_images'])]
    relpaths, total = [], 0
    with tempfile.TemporaryDirectory(dir=root) as tmp:
        made = make_jpegs(tmp, spec['num_images'], spec['long_side'], spec['quality'], spec['seed'])
        for i, (path, label) in enumerate(zip(made, labels)):
            synset = synsets[label]
            rel = f'{synset}/{synset}_{10000 + i}.JPEG'
            os.makedirs(osp.join(folder, 'train', synset), exist_ok=True)
            os.replace(path, osp.join(folder, 'train', rel))
            relpaths.append(rel)
            total += osp.getsize(osp.join(folder, 'train', rel))
    with open(osp.join(folder, LIST_FILE), 'w') as f:
        f.write(''.join(f'{rel} {label}\n' for rel, label in zip(relpaths, labels)))
    # timm's shards hold the samples in a random order.
    order = rng.permutation(spec['num_images'])
    names, counts = [], []
    for s, start in enumerate(range(0, spec['num_images'], spec['shard_size'])):
        names.append(f'{PREFIX}-{SPLIT}-{s:04d}.tar')
        part = order[start:start + spec['shard_size']]
        counts.append(len(part))
        with tarfile.open(osp.join(shards, names[-1]), 'w', format=tarfile.GNU_FORMAT) as tf:
            for i in part.tolist():
                rel, label = relpaths[i], labels[i]
                key = osp.splitext(osp.basename(rel))[0]
                with open(osp.join(folder, 'train', rel), 'rb') as f:
                    jpg = f.read()
                info = inspect_image(jpg, rel, None)
                meta = {'label': label, 'class_name': synsets[label], 'filename': key + '.JPEG',
                        'width': info.width, 'height': info.height}
                _add(tf, key + '.jpg', jpg)
                _add(tf, key + '.cls', str(label).encode())
                _add(tf, key + '.json', json.dumps(meta).encode())
    write_info(shards, names, counts)
    return _save_spec(root, spec, shard_names=names, labels=labels, mean_kib=total / spec['num_images'] / 1024)


def write_index_shards(root: str, num_samples: int, num_shards: int, seed: int = 0) -> List[str]:
    """Write (or reuse) ``num_shards`` shards of ``num_samples`` samples in timm's layout whose members are
    tiny (a 64-byte ``.jpg``, ``.cls``, ``.json``), for the index build; returns the shard names."""
    spec = dict(num_samples=num_samples, num_shards=num_shards, seed=seed)
    saved = _reuse(root, spec)
    if saved is not None:
        return saved['shard_names']
    if osp.isdir(root):
        shutil.rmtree(root)
    os.makedirs(root)
    rng = np.random.default_rng(seed + 2)
    synsets = label_spaces.synsets('fall11')
    labels = rng.integers(len(synsets), size=num_samples)
    payload = rng.integers(0, 256, 64, dtype=np.uint8).tobytes()
    bounds = np.linspace(0, num_samples, num_shards + 1).astype(int)
    names = []
    for s in range(num_shards):
        names.append(f'{PREFIX}-{SPLIT}-{s:04d}.tar')
        with tarfile.open(osp.join(root, names[-1]), 'w', format=tarfile.GNU_FORMAT) as tf:
            for i in range(bounds[s], bounds[s + 1]):
                label = int(labels[i])
                key = f'{synsets[label]}_{i}'
                _add(tf, key + '.jpg', payload)
                _add(tf, key + '.cls', str(label).encode())
                _add(tf, key + '.json', json.dumps({'label': label, 'class_name': synsets[label]}).encode())
    write_info(root, names, np.diff(bounds).tolist())
    return _save_spec(root, spec, shard_names=names)['shard_names']


# -------------------------------------------------------------------------------------------- readers
@contextlib.contextmanager
def pinned(core: int) -> Iterator[None]:
    """Every thread of this process on ``core`` for the ``with`` block (threads started inside inherit it);
    the former masks afterwards."""
    before = {}
    for tid in (int(t) for t in os.listdir('/proc/self/task')):
        try:
            before[tid] = os.sched_getaffinity(tid)
            os.sched_setaffinity(tid, {core})
        except OSError:  # the thread ended meanwhile
            pass
    try:
        yield
    finally:
        for tid, mask in before.items():
            try:
                os.sched_setaffinity(tid, mask)
            except OSError:
                pass


def _serve(folder: str, delay_s: float, cores: Set[int], conn) -> None:
    """The HTTP server's process: serves ``folder``; answers ``'stats'`` on the pipe with the requests and
    bytes served since the last ``'stats'``, and stops at ``'stop'`` (or when the parent is gone)."""
    if cores:
        os.sched_setaffinity(0, cores)
    with serve_folder(folder, delay_s) as server:
        conn.send(server.url)
        while True:
            try:
                message = conn.recv()
            except EOFError:
                return
            if message == 'stop':
                return
            conn.send((server.requests, server.bytes_sent))
            server.reset_counts()


class ServerProcess(NamedTuple):
    url: str
    conn: object  # the pipe to the server's process

    def stats(self) -> Tuple[int, int]:
        """(requests, bytes sent) since the previous call."""
        self.conn.send('stats')
        return self.conn.recv()


@contextlib.contextmanager
def server_process(folder: str, delay_s: float, cores: Set[int]) -> Iterator[ServerProcess]:
    """:func:`serve_folder` in a forked child process on ``cores`` (so that it takes no time of the core
    measured); yields its URL and a way to read its counts."""
    context = multiprocessing.get_context('fork')
    parent, child = context.Pipe()
    process = context.Process(target=_serve, args=(folder, delay_s, cores, child), daemon=True)
    process.start()
    child.close()
    try:
        if not parent.poll(60):
            raise RuntimeError('the loopback HTTP server did not start within 60 s')
        yield ServerProcess(parent.recv(), parent)
    finally:
        try:
            parent.send('stop')
        except OSError:  # the server's process is gone
            pass
        parent.close()
        process.join(10)
        if process.is_alive():
            process.terminate()
            process.join()


def _pass(get: Callable[[int], dict], order: Sequence[int]) -> Callable[[], Tuple[int, int]]:
    def run():
        count = label_sum = 0
        for i in order:
            label_sum += int(get(i)['data_samples'].gt_label)
            count += 1
        return count, label_sum
    return run


def _webdataset_pass(urls: List[str], pipeline, limit: int) -> Callable[[], Tuple[int, int]]:
    import webdataset as wds

    def run():
        count = label_sum = 0
        for sample in wds.WebDataset(urls, shardshuffle=False, empty_check=False):
            if count == limit:
                break
            out = pipeline(dict(img_path=f"{sample['__url__']}:{sample['__key__']}.jpg", img_bytes=sample['jpg'],
                                gt_label=int(sample['cls'])))
            label_sum += int(out['data_samples'].gt_label)
            count += 1
        return count, label_sum
    return run


def measure_readers(args, data: ImageData, work: str) -> Tuple[Dict[str, List[float]], Dict[str, list], dict]:
    """Seconds per pass of each reader per round, what each pass read ((count, label sum) per pass), and
    the setting (cores, URL, the CPU seconds of each timed pass, what the remote passes fetched)."""
    import torch
    from mmengine.dataset import Compose
    from mmengine.registry import init_default_scope

    init_default_scope('mmpretrain')
    torch.set_num_threads(1)
    cv2.setNumThreads(1)
    pipeline = [dict(t) for t in PIPELINE]
    cores = sorted(os.sched_getaffinity(0))
    core = cores[-1] if args.core is None else args.core
    others = set(cores) - {core}
    shard_kwargs = dict(split=SPLIT, label=dict(source='cls'), num_classes=args.num_classes, pipeline=pipeline)
    local = TarShardDataset(data_root=data.shards, **shard_kwargs)
    n = min(args.block_size * args.mix_blocks if args.samples is None else args.samples, len(local))
    sampler = BlockShuffleSampler(local, seed=args.seed, block_size=args.block_size, mix_blocks=args.mix_blocks,
                                  infinite=False, rank=0, world_size=1)
    shard_order = list(sampler)[:n]
    steps, setting = {}, dict(core=core, server_cores=sorted(others), samples=n)
    with contextlib.ExitStack() as stack:
        if 'folder' in args.readers:
            folder = ImageNet21k(data_root=data.folder, ann_file=LIST_FILE, data_prefix='train',
                                 num_classes=args.num_classes, pipeline=pipeline)
            order = np.random.default_rng(args.seed).permutation(len(folder))[:n].tolist()
            steps['folder'] = _pass(folder.__getitem__, order)
        if 'shards' in args.readers:
            steps['shards'] = _pass(local.__getitem__, shard_order)
        if 'webdataset' in args.readers:
            urls = [osp.join(data.shards, name) for name in data.shard_names]
            steps['webdataset'] = _webdataset_pass(urls, Compose(pipeline), n)
        if 'remote' in args.readers:
            server = stack.enter_context(server_process(data.shards, args.delay_ms / 1e3, others))
            url = server.url
            reader_args = {}
            if args.chunk_mib:
                reader_args['chunk_bytes'] = int(args.chunk_mib * (1 << 20))
            if args.readahead is not None:
                reader_args['readahead_chunks'] = args.readahead
            setting.update(url=url, delay_ms=args.delay_ms, reader=repr(ShardReader(**reader_args)))
            caches = osp.join(work, 'chunk_caches')
            remote = {'count': 0}
            index = local._index  # the local index: the bytes of the images a pass reads
            setting['remote_used_bytes'] = int(sum(int(index.sizes[local.row_of(i)]) for i in shard_order))
            setting['remote_fetched'] = []  # (requests, bytes) the server sent in each pass

            def cold():  # a new dataset whose reader starts with an empty chunk cache
                if 'dataset' in remote:
                    remote['dataset'].reader.close()
                    setting['remote_fetched'].append(server.stats())
                    shutil.rmtree(remote['cache'], ignore_errors=True)
                remote['count'] += 1
                remote['cache'] = osp.join(caches, str(remote['count']))
                remote['dataset'] = TarShardDataset(data_root=url, index_file=osp.join(work, 'remote.index'),
                                                    reader=dict(cache_dir=remote['cache'], **reader_args),
                                                    **shard_kwargs)
                server.stats()  # the requests of the set-up (split file, listing, versions) are not counted

            start = time.perf_counter()
            cold()  # builds the index over HTTP once (the port, and so the index, is new every run)
            setting['remote_index_s'] = time.perf_counter() - start
            remote['dataset'].reader.close()
            shutil.rmtree(remote['cache'], ignore_errors=True)  # the scan kept its chunks: every pass starts cold
            read_remote = _pass(lambda i: remote['dataset'][i], shard_order)

            def remote_pass():
                found = read_remote()
                # The read-ahead still running is part of the pass's cost (and of its CPU time).
                remote['dataset'].reader.close()
                return found
            steps['remote'] = remote_pass
        read: Dict[str, list] = {name: [] for name in steps}
        cpu: Dict[str, List[float]] = {name: [] for name in steps}

        def record(name, step):
            def run():
                start = time.process_time()  # every thread of this process
                read[name].append(step())
                cpu[name].append(time.process_time() - start)
            return run
        timed = {name: record(name, step) for name, step in steps.items()}
        np.random.seed(args.seed)
        with pinned(core):
            times = paired_rounds(timed, args.rounds, warmup=args.warmup, rotate=True,
                                  after_step=lambda name: cold() if name == 'remote' else None)
        if 'remote' in steps:
            remote['dataset'].reader.close()
    setting['cpu_s'] = {name: ts[args.warmup:] for name, ts in cpu.items()}  # the timed rounds'
    return times, read, setting


def summarise_readers(times: Dict[str, List[float]], samples: int,
                      cpu: Optional[Dict[str, List[float]]] = None) -> Dict[str, dict]:
    """Samples/s per core (median over rounds) and the paired ratios: against the folder and against the
    local shards (the other reader's time over this one's, per round, median: > 1 is faster). With
    ``cpu`` (the process's CPU seconds per pass), the same per CPU second: what a core does when other
    work fills its waits (several data-loader workers per core)."""
    rows = {}
    for name, ts in times.items():
        rate = [samples / t for t in ts]
        row = dict(samples_per_s=statistics.median(rate), min=min(rate), max=max(rate), times_s=ts)
        for peer in ('folder', 'shards', 'webdataset'):
            if peer in times and peer != name:
                row[f'vs_{peer}'] = statistics.median(p / t for p, t in zip(times[peer], ts))
        if cpu is not None:
            row['samples_per_cpu_s'] = statistics.median(samples / t for t in cpu[name])
            if 'shards' in cpu and name != 'shards':
                row['cpu_vs_shards'] = statistics.median(p / t for p, t in zip(cpu['shards'], cpu[name]))
        rows[name] = row
    return rows


def readers_table(rows: Dict[str, dict]) -> str:
    head = ('reader', 'samples/s per core (median)', 'min-max', 'vs folder', 'vs shards', 'vs webdataset',
            'samples per CPU s', 'vs shards (CPU)')
    lines = ['| ' + ' | '.join(head) + ' |', '|' + '---|' * len(head)]
    for name, r in rows.items():
        ratios = [f"{r[f'vs_{p}']:.2f}x" if f'vs_{p}' in r else '-' for p in ('folder', 'shards', 'webdataset')]
        per_cpu = f"{r['samples_per_cpu_s']:.0f}" if 'samples_per_cpu_s' in r else '-'
        cpu_ratio = f"{r['cpu_vs_shards']:.2f}x" if 'cpu_vs_shards' in r else '-'
        lines.append(f"| {name} | {r['samples_per_s']:.0f} | {r['min']:.0f}-{r['max']:.0f} | " + ' | '.join(ratios)
                     + f' | {per_cpu} | {cpu_ratio} |')
    return '\n'.join(lines)


def targets(rows: Dict[str, dict]) -> List[str]:
    """The targets: local shards at least as fast as the folder, remote at least 0.9 of local."""
    found = []
    if 'vs_folder' in rows.get('shards', {}):
        ratio = rows['shards']['vs_folder']
        found.append(f"shards / folder = {ratio:.3f} (target >= 1): {'met' if ratio >= 1 else 'MISSED'}")
    if 'vs_shards' in rows.get('remote', {}):
        ratio = rows['remote']['vs_shards']
        found.append(f"remote / shards = {ratio:.3f} (target >= 0.9): {'met' if ratio >= 0.9 else 'MISSED'}")
    return found


# ---------------------------------------------------------------------------------------- index build
def _children(pid: int) -> List[int]:
    found = []
    for entry in os.listdir('/proc'):
        if entry.isdigit():
            try:
                with open(f'/proc/{entry}/stat') as f:
                    fields = f.read().rsplit(')', 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                found.append(int(entry))
    return found


def _mib(pid, fields=('Rss', 'Private_Clean', 'Private_Dirty')) -> Dict[str, float]:
    values = {}
    with open(f'/proc/{pid}/smaps_rollup') as f:
        for line in f:
            parts = line.split()
            if len(parts) == 3 and parts[0].rstrip(':') in fields:
                values[parts[0].rstrip(':')] = int(parts[1]) / 1024
    return {'rss': values['Rss'], 'uss': values['Private_Clean'] + values['Private_Dirty']}


class MemoryMonitor:
    """Samples, every ``_POLL_S``, this process's RSS and its child processes' private memory (USS)."""

    def __init__(self):
        self.base_rss = _mib('self')['rss']
        self.peak_rss = self.base_rss
        self.peak_worker_uss = 0.0
        self.peak_added = 0.0  # RSS growth of this process + the USS of its children, at one moment
        self.workers_seen: Set[int] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> None:
        pid = os.getpid()
        rss = _mib(pid)['rss']
        uss = []
        for child in _children(pid):
            try:
                uss.append(_mib(child)['uss'])
                self.workers_seen.add(child)
            except (OSError, KeyError):
                pass
        self.peak_rss = max(self.peak_rss, rss)
        self.peak_worker_uss = max([self.peak_worker_uss] + uss)
        self.peak_added = max(self.peak_added, rss - self.base_rss + sum(uss))

    def _run(self):
        while not self._stop.wait(_POLL_S):
            self._sample()

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self._sample()


def measure_index(folder: str, num_shards: int, workers: int) -> dict:
    """Build the index of the first ``num_shards`` shards of ``folder`` (in this process, with ``workers``
    processes) and report time and memory."""
    import resource

    shards = resolve_shards(folder, f'{PREFIX}-{SPLIT}-{{0000..{num_shards - 1:04d}}}.tar', SPLIT)
    path = osp.join(folder, f'.bench-{os.getpid()}.index')
    peak_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    try:
        with MemoryMonitor() as monitor:
            start = time.perf_counter()
            index = TarShardIndex.open(shards, rule=LabelRule('cls'), index_path=path, workers=workers, rebuild=True)
            seconds = time.perf_counter() - start
        size = osp.getsize(path)
        samples = len(index)
    finally:
        if osp.exists(path):
            os.unlink(path)
    # ru_maxrss is this process's peak since it started: it tells the build's peak when the build raised it.
    peak_after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    peak = max(monitor.peak_rss, peak_after if peak_after > peak_before else 0)
    return dict(samples=samples, shards=num_shards, workers=workers, seconds=seconds,
                builder_peak_growth_mib=peak - monitor.base_rss,
                worker_peak_uss_mib=monitor.peak_worker_uss, peak_added_mib=monitor.peak_added,
                worker_processes=len(monitor.workers_seen), index_bytes=size)


def write_scale_shards(root: str, num_shards: int, samples: int, member_kib: int, seed: int = 0) -> List[str]:
    """``num_shards`` shards of ``samples`` samples (a ``.jpg`` of ``member_kib`` KiB of random bytes and a
    ``.cls``) for :func:`measure_index_scale`; reused while the settings are the same."""
    spec = dict(num_shards=num_shards, samples=samples, member_kib=member_kib, seed=seed)
    saved = _reuse(root, spec)
    if saved is not None:
        return saved['shard_names']
    if osp.isdir(root):
        shutil.rmtree(root)
    os.makedirs(root)
    rng = np.random.default_rng(seed + 3)
    payload = rng.integers(0, 256, member_kib << 10, dtype=np.uint8).tobytes()
    names = []
    for s in range(num_shards):
        names.append(f'{PREFIX}-{SPLIT}-{s:04d}.tar')
        with tarfile.open(osp.join(root, names[-1]), 'w', format=tarfile.GNU_FORMAT) as tf:
            for i in range(samples):
                _add(tf, f'n{s:04d}{i:04d}_{i}.jpg', payload)
                _add(tf, f'n{s:04d}{i:04d}_{i}.cls', str(i % 10).encode())
    return _save_spec(root, spec, shard_names=names)['shard_names']


def measure_index_scale(root: str, counts: Sequence[int], samples: int, member_kib: int, delay_ms: float,
                        work: str) -> dict:
    """Seconds to index the first N shards (each count of ``counts``) with one process: from the local
    folder (page cache warm), and over HTTP (the loopback server, ``delay_ms`` per request) past the chunk
    cache and through it (the scan keeping its chunks). The slope of a least-squares line through the
    counts is the cost per shard; its intercept the fixed cost."""
    names = write_scale_shards(root, max(counts), samples, member_kib)
    shard_mib = osp.getsize(osp.join(root, names[0])) / 2**20
    rows = []
    with serve_folder(root, delay_s=delay_ms / 1e3) as server:
        for count in counts:
            pattern = f'{PREFIX}-{SPLIT}-{{0000..{count - 1:04d}}}.tar'
            for where, base, keep in (('local', root, False), ('remote', server.url, False),
                                      ('remote, kept in the cache', server.url, True)):
                shards = resolve_shards(base, pattern)
                cache = osp.join(work, f'cache-{count}')
                reader = ShardReader(cache_dir=cache) if keep else None
                path = osp.join(work, f'scale-{count}.index')
                server.reset_counts()
                start = time.perf_counter()
                TarShardIndex.open(shards, rule=LabelRule('cls'), index_path=path, workers=1, rebuild=True,
                                   keep_in=reader)
                seconds = time.perf_counter() - start
                rows.append(dict(where=where, shards=count, seconds=seconds, requests=server.requests,
                                 mib_sent=server.bytes_sent / 2**20))
                os.unlink(path)
                shutil.rmtree(cache, ignore_errors=True)
    fits = {}
    for where in dict.fromkeys(r['where'] for r in rows):
        xs = [r['shards'] for r in rows if r['where'] == where]
        ys = [r['seconds'] for r in rows if r['where'] == where]
        slope, intercept = np.polyfit(xs, ys, 1)
        fits[where] = dict(seconds_per_shard=float(slope), fixed_s=float(intercept),
                           seconds_per_mib=float(slope / shard_mib), ms_per_member=float(slope / (2 * samples) * 1e3))
    return dict(shard_mib=shard_mib, samples_per_shard=samples, members_per_shard=2 * samples,
                delay_ms=delay_ms, rows=rows, fits=fits)


def _measure_forked(build: Tuple[str, int, int], conn) -> None:
    try:
        conn.send(('ok', measure_index(*build)))
    except BaseException as err:  # noqa: BLE001 (sent to the parent, which raises it)
        import traceback
        conn.send(('error', traceback.format_exc() or repr(err)))


def measure_builds(builds: Sequence[Tuple[str, int, int]]) -> List[dict]:
    """:func:`measure_index` of each ``(folder, shards, workers)``, each in a process forked from this one
    (so that each starts from the same memory, its modules imported)."""
    context = multiprocessing.get_context('fork')
    found = []
    for build in builds:
        parent, child = context.Pipe()
        process = context.Process(target=_measure_forked, args=(build, child))
        process.start()
        child.close()
        status, value = parent.recv()
        process.join()
        if status != 'ok':
            raise RuntimeError(child_failure(f'index build {build}', value))
        found.append(value)
    return found


def run_index_child(builds: Sequence[Tuple[str, int, int]]) -> List[dict]:
    """:func:`measure_builds` in a fresh interpreter (the memory is the builds' alone, not this process's)."""
    cmd = [sys.executable, '-m', 'benchmarks.benchmark_shards', '--measure-index',
           json.dumps([list(b) for b in builds])]
    env = child_env()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode:
        raise RuntimeError(child_failure('the index builds', proc.stderr))
    return json.loads(proc.stdout.strip().splitlines()[-1])


def per_million(rows: List[dict]) -> Dict[int, dict]:
    """For each worker count: the straight line through the two sizes' seconds and memory, as a slope
    per million samples and an intercept (fixed cost); an extrapolation beyond the sizes measured."""
    out = {}
    for workers in sorted({r['workers'] for r in rows}):
        pts = sorted((r for r in rows if r['workers'] == workers and r.get('set') == 'tiny'),
                     key=lambda r: r['samples'])
        if len(pts) < 2:
            continue
        small, large = pts[0], pts[-1]
        scale = 1e6 / (large['samples'] - small['samples'])
        line = {}
        for key in ('seconds', 'builder_peak_growth_mib', 'peak_added_mib', 'index_bytes'):
            slope = (large[key] - small[key]) * scale
            line[key] = dict(per_million=slope, fixed=large[key] - slope * large['samples'] / 1e6)
        out[workers] = line
    return out


def fit_problems(lines: Dict[int, dict]) -> List[str]:
    """Why the straight lines of :func:`per_million` mean nothing beyond the sizes measured (none: they do).

    A line's seconds must grow with the samples (positive slope) from a fixed cost that is not negative, and
    more processes must build faster per million samples than one: at sizes where start-up and noise
    dominate, none of this holds.
    """
    found = []
    for workers, line in lines.items():
        seconds = line['seconds']
        if seconds['per_million'] <= 0:
            found.append(f"{workers} processes: {seconds['per_million']:.2f} s per million (not positive)")
        elif seconds['fixed'] < 0:
            found.append(f"{workers} processes: a negative fixed cost ({seconds['fixed']:+.2f} s)")
    if 1 in lines and len(lines) > 1:
        most = max(lines)
        if lines[most]['seconds']['per_million'] >= lines[1]['seconds']['per_million']:
            found.append(f'{most} processes are no faster per million samples than 1')
    return found


def index_table(rows: List[dict]) -> str:
    head = ('shards', 'samples', 'processes', 'seconds', 'builder peak RSS +MiB', 'worker peak USS MiB',
            'peak added MiB', 'index MiB')
    lines = ['| ' + ' | '.join(head) + ' |', '|' + '---|' * len(head)]
    for r in rows:
        lines.append(f"| {r['shards']} {r['set']} | {r['samples']:,} | {r['workers']} | {r['seconds']:.2f} | "
                     f"{r['builder_peak_growth_mib']:.1f} | {r['worker_peak_uss_mib']:.1f} | "
                     f"{r['peak_added_mib']:.1f} | {r['index_bytes'] / 2**20:.1f} |")
    return '\n'.join(lines)


def per_million_table(lines: Dict[int, dict]) -> str:
    head = ('processes', 'seconds per million (fixed)', 'builder peak RSS MiB per million (fixed)',
            'peak added MiB per million (fixed)', 'index MiB per million')
    out = ['| ' + ' | '.join(head) + ' |', '|' + '---|' * len(head)]
    for workers, line in lines.items():
        s, b, a, i = (line[k] for k in ('seconds', 'builder_peak_growth_mib', 'peak_added_mib', 'index_bytes'))
        out.append(f"| {workers} | {s['per_million']:.1f} ({s['fixed']:+.2f}) | {b['per_million']:.1f} "
                   f"({b['fixed']:+.1f}) | {a['per_million']:.1f} ({a['fixed']:+.1f}) | "
                   f"{i['per_million'] / 2**20:.1f} |")
    return '\n'.join(out)


# ----------------------------------------------------------------------------------------------- main
def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.measure_index:
        print(json.dumps(measure_builds([tuple(b) for b in json.loads(args.measure_index)])))
        return {}
    started = time.perf_counter()
    os.makedirs(args.data_dir, exist_ok=True)
    if args.index_scale:
        with tempfile.TemporaryDirectory(prefix='index_scale_', dir=args.data_dir) as work:
            result = measure_index_scale(osp.join(args.data_dir, 'scale_shards'), args.index_scale,
                                         args.scale_samples, args.scale_member_kib, args.delay_ms, work)
        for row in result['rows']:
            print(f"{row['where']:>27}: {row['shards']:>3} shards {row['seconds']:7.2f} s, "
                  f"{row['requests']:>5} requests, {row['mib_sent']:8.1f} MiB sent")
        for where, fit in result['fits'].items():
            caveat = '' if fit['fixed_s'] >= 0 and fit['seconds_per_shard'] > 0 else ' (the fit means nothing here)'
            print(f"{where:>27}: {fit['seconds_per_shard'] * 1e3:.1f} ms per shard of {result['shard_mib']:.1f} MiB "
                  f"({fit['seconds_per_mib'] * 1e3:.2f} ms per MiB, {fit['ms_per_member']:.3f} ms per member), "
                  f"fixed {fit['fixed_s']:.2f} s{caveat}")
        if args.out:
            write_result(result, args.out)
        return result
    data = write_images(args.data_dir, args.num_images, args.long_side, args.quality, args.num_classes,
                        args.shard_size, args.seed)
    print(f'{args.num_images} JPEGs of {args.long_side} px (quality {args.quality}, {data.mean_kib:.0f} KiB on '
          f'average), {len(data.shard_names)} shards, in {args.data_dir} '
          f'({time.perf_counter() - started:.0f} s to write or check)', flush=True)
    result = dict(setting=dict(num_images=args.num_images, long_side=args.long_side, quality=args.quality,
                               mean_file_kib=round(data.mean_kib, 1), num_classes=args.num_classes,
                               shard_size=args.shard_size, shards=len(data.shard_names), rounds=args.rounds,
                               warmup=args.warmup, block_size=args.block_size, mix_blocks=args.mix_blocks,
                               cpu=platform.processor() or platform.machine(), cpu_count=os.cpu_count(),
                               python=platform.python_version()))
    with tempfile.TemporaryDirectory(prefix='shards_bench_', dir=args.data_dir) as work:
        times, read, setting = measure_readers(args, data, work)
    result['setting'].update(setting)
    result['readers'] = summarise_readers(times, setting['samples'], setting['cpu_s'])
    result['read'] = read
    print(f"\nOne core (core {setting['core']}), {setting['samples']} samples per pass, median of {args.rounds} "
          f"rounds; ratios: median of per-round ratios (> 1: faster)")
    print(readers_table(result['readers']))
    if setting.get('remote_fetched'):
        requests, sent = np.median(np.array(setting['remote_fetched'], dtype=float), axis=0)
        print(f"remote, per pass (median): {requests:.0f} requests, {sent / 2**20:.0f} MiB fetched for "
              f"{setting['remote_used_bytes'] / 2**20:.0f} MiB of images read; index over HTTP built in "
              f"{setting['remote_index_s']:.1f} s")
    result['targets'] = targets(result['readers'])
    for line in result['targets']:
        print(line)
    if args.index_samples:
        root = osp.join(args.data_dir, 'index_shards')
        start = time.perf_counter()
        write_index_shards(root, args.index_samples, args.index_shards, args.seed)
        print(f'\nindex shards: {args.index_samples:,} samples in {args.index_shards} shards ({root}, '
              f'{time.perf_counter() - start:.0f} s to write or check)', flush=True)
        every = os.cpu_count() or 1
        builds = [(root, shards, workers) for workers in (every, 1)
                  for shards in (args.index_shards // 2, args.index_shards)]
        builds.append((data.shards, len(data.shard_names), every))
        rows = [dict(row, set='images' if folder == data.shards else 'tiny')
                for (folder, _, _), row in zip(builds, run_index_child(builds))]
        result['index'] = rows
        lines = per_million(rows)
        result['index_per_million'] = {str(k): v for k, v in lines.items()}
        result['index_fit_problems'] = problems = fit_problems(lines)
        print(index_table(rows))
        if problems:
            print('Per million samples: not extrapolated, the line through the two sizes means nothing here ('
                  + '; '.join(problems) + '); measure more --index-samples.')
        else:
            print('Per million samples (extrapolated: the line through the two sizes of tiny-member shards):')
            print(per_million_table(lines))
    result['seconds'] = time.perf_counter() - started
    print(f'\n{result["seconds"]:.0f} s in all')
    if args.out:
        write_result(result, args.out)
        print(f'written {args.out}')
    return result


if __name__ == '__main__':  # the index-measuring child processes run this module (run_index_child)
    main()
