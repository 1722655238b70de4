"""Masked patch prediction -> detection on the generated shapes data, against two from-scratch baselines.

For every seed, in one process, with the configs in ``configs/``:

1. ``mpp``: masked-patch-prediction pre-training of the shapes detector's ViT on unlabelled shapes
   images (``mpp_vit_tiny_shapes.py``, seeded);
2. ``vit-mpp``: the ViT Mask R-CNN initialised from that checkpoint
   (``mask_rcnn_vit_tiny_simplefpn_shapes_ft-mpp.py``);
3. ``vit-scratch``: the same detector from random initialisation (``mask_rcnn_vit_tiny_simplefpn_shapes.py``);
4. ``r18``: the same heads on mmdet's ResNet-18 + FPN from scratch (``mask_rcnn_r18_fpn_shapes.py``);

and writes ``results.json`` into the work directory: per run COCO bbox / segm mAP and mAP_50 on the
val split, the wall time of every stage and the final MPP loss; per arm the mean and standard deviation
over seeds. Rerun with::

    python projects/mpp_detection/run_chain.py --seeds 0 1 2 --work-dir work_dirs/mpp_detection

``--budget full`` (the default) trains with the configs' own schedules; ``--budget toy`` runs a few
iterations on a handful of images (a check that the chain works end to end, not an experiment).
"""
import argparse
import json
import os
import os.path as osp
import time

import numpy as np
import torch

HERE = osp.dirname(osp.abspath(__file__))
ROOT = osp.dirname(osp.dirname(HERE))
CONFIGS = osp.join(ROOT, 'configs')
ARMS = ('mpp', 'vit-mpp', 'vit-scratch', 'r18')
DETECTOR_CONFIGS = {'vit-mpp': 'mask_rcnn_vit_tiny_simplefpn_shapes_ft-mpp.py',
                    'vit-scratch': 'mask_rcnn_vit_tiny_simplefpn_shapes.py',
                    'r18': 'mask_rcnn_r18_fpn_shapes.py'}
METRICS = ('bbox_mAP', 'bbox_mAP_50', 'segm_mAP', 'segm_mAP_50')
# The toy budget: enough to pass through every stage (data generation, training, checkpoint hand-off,
# COCO evaluation) in seconds.
TOY = dict(mpp_iters=2, mpp_batch=4, unlabelled=8, num_images=dict(train=4, val=4), det_batch=2, epochs=1)


def _relative(path, work_dir):
    """A recorded path made relative: to the repository root for one inside it, else to ``work_dir``
    (where results.json is), so that results files carry no machine's absolute paths."""
    if not isinstance(path, str):
        return path
    path = osp.abspath(path)
    return osp.relpath(path, ROOT if path.startswith(ROOT + os.sep) else osp.abspath(work_dir))


def _portable(results):
    """``results`` with the recorded paths relative (see :func:`_relative`)."""
    work_dir = results['args']['work_dir']
    args = {k: _relative(v, work_dir) if k in ('work_dir', 'data_root') else v for k, v in results['args'].items()}
    runs = {arm: [dict(run, checkpoint=_relative(run['checkpoint'], work_dir)) if 'checkpoint' in run else run
                  for run in arm_runs] for arm, arm_runs in results['runs'].items()}
    return dict(results, args=args, runs=runs,
                paths='relative to the repository root, or to the folder of this file when outside it')


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--seeds', type=int, nargs='+', default=[0, 1, 2])
    parser.add_argument('--budget', choices=['toy', 'full'], default='full',
                        help="'full': the configs' schedules; 'toy': a few iterations on a few images")
    parser.add_argument('--arms', nargs='+', choices=ARMS, default=list(ARMS),
                        help='what to run per seed (vit-mpp needs mpp). Defaults to all four')
    parser.add_argument('--work-dir', default=osp.join(ROOT, 'work_dirs', 'mpp_detection'))
    parser.add_argument('--data-root', help='where the shapes data is (written on first use); defaults to the '
                        "configs' data/shapes_coco/ for --budget full and <work-dir>/data/ for --budget toy, "
                        'whose small splits would otherwise replace the full ones')
    parser.add_argument('--mpp-iters', type=int,
                        help="MPP pre-training iterations; defaults to the config's max_iters (toy: 2)")
    args = parser.parse_args(argv)
    if 'vit-mpp' in args.arms and 'mpp' not in args.arms:
        parser.error('the vit-mpp arm fine-tunes the checkpoint of the mpp arm: add mpp to --arms')
    if args.mpp_iters is not None and args.mpp_iters < 1:
        parser.error(f'--mpp-iters must be >= 1, got {args.mpp_iters}')
    if args.data_root is None:
        args.data_root = (osp.join(ROOT, 'data', 'shapes_coco') if args.budget == 'full'
                          else osp.join(args.work_dir, 'data'))
    args.data_root = osp.join(osp.abspath(args.data_root), '')  # the configs join it with a trailing '/'
    return args


def _run(cfg, name, work_dir):
    from mmengine.registry import RUNNERS
    cfg.work_dir = osp.join(work_dir, name)
    # one logger, message hub and default scope per run inside this process
    cfg.experiment_name = f"{name}-{time.strftime('%Y%m%d_%H%M%S')}"
    runner = RUNNERS.build(cfg)  # the runner the config names
    start = time.time()
    runner.train()
    return runner, time.time() - start


def pretrain(args, seed):
    """MPP pre-training; returns its record (with the checkpoint path)."""
    from mmengine.config import Config
    cfg = Config.fromfile(osp.join(CONFIGS, 'mpp_vit_tiny_shapes.py'))
    iters = args.mpp_iters or (TOY['mpp_iters'] if args.budget == 'toy' else cfg.train_cfg.max_iters)
    # the warm-up keeps its share of the schedule when the length changes
    warmup = max(1, round(iters * cfg.param_scheduler[0].end / cfg.train_cfg.max_iters))
    cfg.train_cfg.max_iters = iters
    cfg.param_scheduler[0].end = cfg.param_scheduler[1].begin = min(warmup, iters - 1) or 1
    cfg.param_scheduler[1].end = iters
    cfg.default_hooks.checkpoint.interval = iters
    loader = cfg.train_dataloader
    loader.dataset.data_root = args.data_root
    loader.num_workers = 0
    if args.budget == 'toy':
        loader.batch_size = TOY['mpp_batch']
        loader.dataset.num_images = TOY['unlabelled']
        cfg.default_hooks.logger.interval = 1
    cfg.randomness = dict(seed=seed)
    runner, seconds = _run(cfg, f'mpp-seed{seed}', args.work_dir)
    loss = [float(v) for v in runner.message_hub.get_scalar('train/loss').data[0]]
    checkpoint = osp.join(cfg.work_dir, f'iter_{iters}.pth')
    if not osp.isfile(checkpoint):
        raise FileNotFoundError(f'MPP pre-training did not write {checkpoint}')
    tail = max(1, len(loss) // 10)
    return dict(seed=seed, seconds=seconds, iters=iters, batch_size=loader.batch_size,
                loss_first=float(np.mean(loss[:tail])), loss_final=float(np.mean(loss[-tail:])),
                checkpoint=checkpoint)


def detect(args, arm, seed, checkpoint=None):
    """Train one detector arm and evaluate it on the val split once at the end."""
    from mmengine.config import Config
    cfg = Config.fromfile(osp.join(CONFIGS, DETECTOR_CONFIGS[arm]))
    if checkpoint is not None:
        cfg.model.backbone.init_cfg.checkpoint = checkpoint
    for key in ('train_dataloader', 'val_dataloader', 'test_dataloader'):
        loader = cfg[key]
        loader.dataset.data_root = args.data_root
        loader.num_workers = 0
        loader.persistent_workers = False
        if args.budget == 'toy':
            loader.dataset.num_images = TOY['num_images']
            loader.batch_size = TOY['det_batch']
    cfg.val_evaluator.ann_file = cfg.test_evaluator.ann_file = osp.join(args.data_root, 'annotations',
                                                                        'instances_val.json')
    if args.budget == 'toy':
        epochs = TOY['epochs']
        cfg.train_cfg.update(max_epochs=epochs, val_interval=epochs)
        cfg.param_scheduler[1].end = epochs
        cfg.default_hooks.checkpoint.interval = epochs
        cfg.default_hooks.logger.interval = 1
    cfg.randomness = dict(seed=seed)
    runner, seconds = _run(cfg, f'{arm}-seed{seed}', args.work_dir)
    record = dict(seed=seed, seconds=seconds, epochs=cfg.train_cfg.max_epochs)
    if checkpoint is not None:
        record['checkpoint'] = checkpoint
    for metric in METRICS:
        key = f'val/coco/{metric}'
        # COCO evaluation leaves the metrics out when the model detects nothing at all: record None
        record[metric] = float(runner.message_hub.get_scalar(key).current()) \
            if key in runner.message_hub.log_scalars else None
    return record


def summarise(runs):
    """Mean and sample standard deviation over seeds of every number recorded for an arm."""
    summary = {}
    for arm, arm_runs in runs.items():
        keys = [k for k in arm_runs[0] if k not in ('seed', 'checkpoint')]
        summary[arm] = {}
        for key in keys:
            values = [r[key] for r in arm_runs if r[key] is not None]
            summary[arm][key] = dict(mean=float(np.mean(values)) if values else None,
                                     std=float(np.std(values, ddof=1)) if len(values) > 1 else None,
                                     n=len(values))
    return summary


def _cell(stat, scale=1.0, digits=3):
    if stat is None or stat['mean'] is None:
        return '-'
    text = f"{stat['mean'] * scale:.{digits}f}"
    return text + (f" +- {stat['std'] * scale:.{digits}f}" if stat['std'] is not None else '')


def table(summary):
    """The results as a text table: one row per arm."""
    header = ['arm', *METRICS, 'MPP loss', 'seconds']
    rows = [header]
    for arm, stats in summary.items():
        rows.append([arm, *(_cell(stats.get(m)) for m in METRICS), _cell(stats.get('loss_final')),
                     _cell(stats.get('seconds'), digits=0)])
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    return '\n'.join('  '.join(cell.ljust(w) for cell, w in zip(row, widths)) for row in rows)


def main(argv=None):
    args = parse_args(argv)
    import vit_plugin  # noqa: F401  (registers components; the runners import it again via custom_imports)
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    os.makedirs(args.work_dir, exist_ok=True)
    runs = {arm: [] for arm in ARMS if arm in args.arms}
    path = osp.join(args.work_dir, 'results.json')

    def save():  # after every run: a long chain that stops early keeps what it measured
        results = dict(args=vars(args), runs={k: v for k, v in runs.items() if v},
                       summary=summarise({k: v for k, v in runs.items() if v}))
        with open(path + '.tmp', 'w') as f:
            json.dump(_portable(results), f, indent=1)
        os.replace(path + '.tmp', path)
        return results

    for seed in args.seeds:
        checkpoint = None
        if 'mpp' in args.arms:
            runs['mpp'].append(pretrain(args, seed))
            checkpoint = runs['mpp'][-1]['checkpoint']
            save()
        for arm in ('vit-mpp', 'vit-scratch', 'r18'):
            if arm in args.arms:
                runs[arm].append(detect(args, arm, seed, checkpoint if arm == 'vit-mpp' else None))
                save()
    results = save()
    print(table(results['summary']))
    print(f'written: {path}')
    return results


if __name__ == '__main__':
    main()
