"""The embedded demo behind ``make demo``: train and evaluate a small ViT on handwritten digits.

1. prepares scikit-learn's bundled digits as an image-folder dataset under ``data/digits`` (once);
2. trains ``configs/vit_demo_digits.py`` with MMEngine's runner, logging progress as it goes;
3. evaluates the final model on the held-out test split and prints its top-1 accuracy;
4. writes the training curve (loss and test top-1) to ``<work_dir>/training_curve.png``.

    python tools/demo.py [--work-dir work_dirs/vit_demo_digits] [--cfg-options key=value ...]
"""
import argparse
import json
import os
import os.path as osp
import sys
import time

from mmengine.config import Config, DictAction
from mmengine.registry import RUNNERS

from vit_plugin.datasets.digits import prepare_digits_dataset

REPO_ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))

CONFIG = osp.join(REPO_ROOT, 'configs', 'vit_demo_digits.py')
TARGET_TOP1 = 90.0  # the demo's promise (README "Measured results")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--config', default=CONFIG, help='demo config (default: %(default)s)')
    parser.add_argument('--work-dir', default=osp.join('work_dirs', 'vit_demo_digits'),
                        help='logs, checkpoints and the plot go here (default: %(default)s)')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction, metavar='KEY=VALUE',
                        help='override config entries')
    return parser.parse_args(argv)


def read_scalars(log_dir: str):
    """Training losses ``[(iter, loss)]`` and validation top-1 ``[(iter, top1)]`` of a run."""
    losses, top1 = [], []
    path = osp.join(log_dir, 'vis_data', 'scalars.json')
    with open(path) as f:
        records = [json.loads(line) for line in f if line.strip()]
    last_iter = 0
    for rec in records:
        if 'loss' in rec:
            last_iter = rec.get('iter', rec['step'])
            losses.append((last_iter, rec['loss']))
        elif 'accuracy/top1' in rec:
            top1.append((last_iter, rec['accuracy/top1']))
    return losses, top1


def plot_curve(losses, top1, out_file: str, title: str) -> None:
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt

    fig, ax_loss = plt.subplots(figsize=(7, 4.2), dpi=120)
    ax_loss.plot(*zip(*losses), color='tab:blue', lw=1.2, label='training loss')
    ax_loss.set_xlabel('iteration')
    ax_loss.set_ylabel('training loss', color='tab:blue')
    ax_loss.set_yscale('log')
    if top1:
        ax_acc = ax_loss.twinx()
        ax_acc.plot(*zip(*top1), 'o-', color='tab:red', lw=1.5, label='test top-1')
        ax_acc.set_ylabel('test top-1 (%)', color='tab:red')
        ax_acc.set_ylim(0, 100)
        ax_acc.axhline(TARGET_TOP1, color='tab:red', ls=':', lw=0.8)
    ax_loss.set_title(title)
    fig.tight_layout()
    fig.savefig(out_file)
    plt.close(fig)


def main(argv=None):
    args = parse_args(argv)
    start = time.time()
    cfg = Config.fromfile(args.config)
    if args.cfg_options:
        cfg.merge_from_dict(args.cfg_options)
    cfg.work_dir = args.work_dir
    cfg.launcher = 'none'

    data_root = cfg.train_dataloader.dataset.data_root
    print(f'[demo] preparing the digits dataset in {data_root} (scikit-learn, no download) ...', flush=True)
    prepare_digits_dataset(data_root)
    with open(osp.join(data_root, 'meta.json')) as f:
        meta = json.load(f)
    print(f'[demo] {meta["num_train"]} training / {meta["num_test"]} test images, 10 classes', flush=True)
    print(f'[demo] training {osp.relpath(args.config, REPO_ROOT)} for {cfg.train_cfg.max_epochs} epochs '
          f'on {os.cpu_count()} CPU core(s); progress is logged every '
          f'{cfg.default_hooks.logger.interval} iterations', flush=True)

    runner = RUNNERS.build(cfg)  # the runner the config names (vit_plugin.Runner)
    runner.train()
    train_time = time.time() - start
    metrics = runner.test()
    top1 = float(metrics['accuracy/top1'])
    total = time.time() - start

    losses, curve = read_scalars(runner.log_dir)
    plot_file = osp.join(args.work_dir, 'training_curve.png')
    plot_curve(losses, curve, plot_file, f'ViT on handwritten digits: {top1:.1f}% top-1 in {total / 60:.1f} min')
    summary = dict(top1=top1, train_seconds=round(train_time, 1), total_seconds=round(total, 1),
                   num_test_images=meta['num_test'], plot=plot_file)
    with open(osp.join(args.work_dir, 'demo_result.json'), 'w') as f:
        json.dump(summary, f, indent=1)

    print('\n' + '=' * 72)
    print(f'[demo] top-1 accuracy on the digits test split ({meta["num_test"]} images): {top1:.2f}%')
    print(f'[demo] time: {train_time:.0f} s training, {total:.0f} s in total')
    print(f'[demo] training curve: {plot_file}')
    print('=' * 72)
    if top1 < TARGET_TOP1:
        print(f'[demo] below the expected {TARGET_TOP1:.0f}% -- something is off; see the log in '
              f'{runner.log_dir}', file=sys.stderr)
        return 1
    return 0


if __name__ == '__main__':
    sys.exit(main())
