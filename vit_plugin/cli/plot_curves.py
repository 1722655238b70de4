"""``tools/analysis/plot_curves.py``: the training curves of one or several runs in one figure, the way
mmpretrain's ``analyze_logs.py plot_curve`` draws them, from what a run writes while it trains.

    python tools/analysis/plot_curves.py WORK_DIR [WORK_DIR ...] [--keys loss lr ...] [--source events]
        [--out curves.png] [--title TEXT]

Each WORK_DIR is a ``tools/train.py`` work dir: its runs' ``<timestamp>/vis_data/scalars.json``
(mmengine's ``LocalVisBackend``, always written) or, with ``--source events``, the TensorBoard event files
beside them (``--vis tensorboard``). A resumed run is drawn as one curve: its segments are read in time
order, a later value of a step replacing an earlier one. One panel per key; a key no run has is left out.
See docs/monitoring.md.
"""
import argparse
import glob
import json
import os.path as osp
from typing import Dict, List, Optional, Sequence, Tuple

#: The keys drawn by default: training loss, learning rate, gradient norm, validation top-1.
DEFAULT_KEYS = ('loss', 'lr', 'grad_norm', 'accuracy/top1')

Series = Dict[str, List[Tuple[int, float]]]


def log_dirs(work_dir: str) -> List[str]:
    """The ``vis_data`` folders of ``work_dir``'s segments, oldest first (a ``vis_data`` folder itself is
    its own list)."""
    if osp.basename(osp.normpath(work_dir)) == 'vis_data':
        return [work_dir]
    found = sorted(glob.glob(osp.join(work_dir, '*', 'vis_data')))  # timestamps sort in time order
    if not found:
        raise FileNotFoundError(f'{work_dir}: no <timestamp>/vis_data folder; give the work dir of a run of '
                                f'tools/train.py (its --work-dir).')
    return found


def _merge(segments: Sequence[Series]) -> Series:
    merged: Dict[str, Dict[int, float]] = {}
    for series in segments:
        for key, points in series.items():
            merged.setdefault(key, {}).update(points)
    return {key: sorted(points.items()) for key, points in merged.items()}


def read_scalars_json(work_dir: str) -> Series:
    """Key -> ``[(step, value)]`` of every scalar in the run's ``scalars.json`` files."""
    segments = []
    for folder in log_dirs(work_dir):
        series: Series = {}
        path = osp.join(folder, 'scalars.json')
        if osp.isfile(path):
            with open(path) as f:
                for line in f:
                    if line.strip():
                        record = json.loads(line)
                        step = int(record.pop('step'))
                        for key, value in record.items():
                            if isinstance(value, (int, float)):
                                series.setdefault(key, []).append((step, float(value)))
        segments.append(series)
    return _merge(segments)


def read_event_scalars(work_dir: str) -> Series:
    """Key -> ``[(step, value)]`` of every scalar in the run's TensorBoard event files, read with
    TensorBoard's own reader (``EventAccumulator``; the package ``tensorboard``)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    segments = []
    for folder in log_dirs(work_dir):
        if not glob.glob(osp.join(folder, 'events.out.tfevents.*')):
            continue
        events = EventAccumulator(folder, size_guidance={'scalars': 0})  # 0: keep every point
        events.Reload()
        segments.append({tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()['scalars']})
    if not segments:
        raise FileNotFoundError(f'{work_dir}: no TensorBoard event file; train with --vis tensorboard, or plot '
                                f'scalars.json (the default --source).')
    return _merge(segments)


def plot_curves(runs: Dict[str, Series], keys: Sequence[str], out_file: str, title: Optional[str] = None) -> List[str]:
    """Draw one panel per key of ``keys`` that a run has, one line per run; returns the keys drawn."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt

    drawn = [key for key in keys if any(key in series for series in runs.values())]
    if not drawn:
        raise ValueError(f'none of the keys {", ".join(keys)} is in the runs; they have: '
                         f'{", ".join(sorted({k for series in runs.values() for k in series}))}.')
    cols = min(2, len(drawn))
    rows = (len(drawn) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(5.2 * cols, 3.4 * rows), dpi=110, squeeze=False)
    for ax, key in zip(axes.flat, drawn):
        for name, series in runs.items():
            if key in series:
                ax.plot(*zip(*series[key]), lw=1.3, marker='o' if len(series[key]) < 30 else None, ms=3,
                        label=name)
        ax.set_title(key)
        ax.set_xlabel('step')
        ax.grid(alpha=0.3)
        if key == 'loss':
            ax.set_yscale('log')
        if len(runs) > 1:
            ax.legend(fontsize=8)
    for ax in list(axes.flat)[len(drawn):]:
        ax.set_visible(False)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(out_file)
    plt.close(fig)
    return drawn


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description='Draw the training curves of one or several runs '
                                     '(scalars.json, or the TensorBoard event files with --source events).')
    parser.add_argument('work_dirs', nargs='+', metavar='WORK_DIR', help='work dir(s) of tools/train.py runs')
    parser.add_argument('--keys', nargs='+', default=list(DEFAULT_KEYS),
                        help=f'scalars to draw, one panel each (default: {" ".join(DEFAULT_KEYS)})')
    parser.add_argument('--source', choices=('scalars', 'events'), default='scalars',
                        help='scalars.json (LocalVisBackend) or the TensorBoard event files (default: scalars)')
    parser.add_argument('--out', default='curves.png', help='image file to write (default: curves.png)')
    parser.add_argument('--title', help='title of the figure')
    return parser.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    read = read_event_scalars if args.source == 'events' else read_scalars_json
    runs = {}
    for work_dir in args.work_dirs:
        name = osp.basename(osp.normpath(work_dir))
        runs[name if name not in runs else work_dir] = read(work_dir)
    drawn = plot_curves(runs, args.keys, args.out, args.title)
    print(f'{args.out}: {", ".join(drawn)} of {len(runs)} run(s)')
