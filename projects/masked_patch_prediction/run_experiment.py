"""Masked patch prediction on the embedded digits: MPP pre-training -> fine-tuning vs training from scratch.

Runs, in one process and with the configs next to this file:

1. MPP pre-training of the tiny ViT on the digits' training split (labels unused);
2. for every seed, supervised training with the *same* recipe and budget from (a) the MPP backbone and
   (b) random initialisation, evaluating test top-1 along the way;
3. few-shot linear evaluation (the paper's closed-form ridge regression, ``vit_plugin.evaluation``) of
   frozen features of the MPP backbone and of a randomly initialised one;

and writes ``results.json`` and ``comparison.png`` into the work directory. Rerun with::

    python projects/masked_patch_prediction/run_experiment.py --work-dir work_dirs/mpp_experiment

The defaults are what projects/masked_patch_prediction/README.md reports; larger budgets
(``--mpp-iters``, ``--ft-iters``, more ``--seeds``) only need more time.
"""
import argparse
import glob
import json
import os
import os.path as osp
import time

import numpy as np
import torch

HERE = osp.dirname(osp.abspath(__file__))
ROOT = osp.dirname(osp.dirname(HERE))


def _relative(path):
    """A path inside the repository, relative to its root (results files are shared)."""
    if isinstance(path, str) and osp.abspath(path).startswith(ROOT + os.sep):
        return osp.relpath(osp.abspath(path), ROOT)
    return path


def _portable(results):
    """``results`` with the recorded paths relative to the repository root."""
    args = {k: _relative(v) for k, v in results['args'].items()}
    mpp = dict(results['mpp'], checkpoint=_relative(results['mpp'].get('checkpoint')))
    return dict(results, args=args, mpp=mpp)


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--work-dir', default=osp.join(ROOT, 'work_dirs', 'mpp_experiment'))
    parser.add_argument('--data-root', default=osp.join(ROOT, 'data', 'digits'))
    parser.add_argument('--mpp-iters', type=int, default=200, help='MPP pre-training iterations (batch 64)')
    parser.add_argument('--ft-iters', type=int, default=100, help='supervised iterations per run (batch 64)')
    parser.add_argument('--val-interval', type=int, default=25)
    parser.add_argument('--seeds', type=int, nargs='+', default=[0])
    parser.add_argument('--shots', type=int, nargs='+', default=[1, 5, 10, 25])
    parser.add_argument('--mpp-checkpoint', help='reuse this MPP checkpoint instead of pre-training again '
                        '(e.g. to add seeds); the MPP loss curve is then not part of the results')
    return parser.parse_args()


def _schedule(cfg, iters, warmup):
    cfg.train_cfg.max_iters = iters
    cfg.param_scheduler[0].end = cfg.param_scheduler[1].begin = warmup
    cfg.param_scheduler[1].end = iters
    cfg.default_hooks.checkpoint.interval = iters


def _run(cfg, name, work_dir):
    from mmengine.runner import Runner
    cfg.work_dir = osp.join(work_dir, name)
    cfg.experiment_name = name  # one logger per run inside this process
    runner = Runner.from_cfg(cfg)
    start = time.time()
    runner.train()
    return runner, time.time() - start


def pretrain(args):
    from mmengine.config import Config
    cfg = Config.fromfile(osp.join(HERE, 'configs', 'mpp_tiny-vit_digits.py'))
    _schedule(cfg, args.mpp_iters, max(1, args.mpp_iters // 15))
    cfg.train_dataloader.dataset.data_root = args.data_root
    cfg.train_dataloader.num_workers = 0
    cfg.randomness = dict(seed=0)
    runner, seconds = _run(cfg, 'mpp', args.work_dir)
    hub = runner.message_hub
    ckpt = osp.join(cfg.work_dir, f'iter_{args.mpp_iters}.pth')
    return dict(loss=[float(v) for v in hub.get_scalar('train/loss').data[0]],
                acc=[float(v) for v in hub.get_scalar('train/acc').data[0]], seconds=seconds,
                checkpoint=ckpt), runner.model


def load_pretrained(args):
    from mmengine.config import Config
    from mmengine.registry import init_default_scope
    from mmengine.runner import load_checkpoint
    from mmpretrain.registry import MODELS
    init_default_scope('mmpretrain')
    model = MODELS.build(Config.fromfile(osp.join(HERE, 'configs', 'mpp_tiny-vit_digits.py')).model)
    load_checkpoint(model, args.mpp_checkpoint, map_location='cpu')
    return dict(checkpoint=args.mpp_checkpoint), model


def finetune(args, seed, mpp_checkpoint=None):
    from mmengine.config import Config
    name = 'ft-mpp' if mpp_checkpoint else 'scratch'
    cfg = Config.fromfile(osp.join(HERE, 'configs', 'tiny-vit_digits_ft-mpp.py' if mpp_checkpoint
                                   else 'tiny-vit_digits_scratch.py'))
    if mpp_checkpoint:
        cfg.model.backbone.init_cfg.checkpoint = mpp_checkpoint
    _schedule(cfg, args.ft_iters, max(1, args.ft_iters // 10))
    cfg.train_cfg.val_interval = args.val_interval
    for loader in (cfg.train_dataloader, cfg.val_dataloader, cfg.test_dataloader):
        loader.dataset.data_root = args.data_root
        loader.num_workers = 0
    cfg.randomness = dict(seed=seed)
    runner, seconds = _run(cfg, f'{name}-seed{seed}', args.work_dir)
    top1 = [float(v) for v in runner.message_hub.get_scalar('val/accuracy/top1').data[0]]
    steps = list(range(args.val_interval, args.ft_iters + 1, args.val_interval))
    return dict(steps=steps, top1=top1[-len(steps):], seconds=seconds)


def _load_split(data_root, split):
    from PIL import Image
    images, labels = [], []
    for path in sorted(glob.glob(osp.join(data_root, split, '*', '*.png'))):
        images.append(np.asarray(Image.open(path).convert('RGB')))
        labels.append(int(osp.basename(osp.dirname(path))))
    pixels = torch.from_numpy(np.stack(images)).permute(0, 3, 1, 2).float()
    return (pixels - 127.5) / 127.5, np.array(labels)  # the configs' normalisation


@torch.no_grad()
def _features(backbone, images):
    backbone.eval()
    feats = [backbone.forward_features(chunk) for chunk in images.split(256)]
    tokens = torch.cat(feats)
    # MPP never trains the class token directly, so the mean patch token is its natural summary.
    return tokens[:, backbone.num_prefix_tokens:].mean(dim=1).numpy()


def fewshot(args, mpp_model):
    from mmpretrain.registry import MODELS
    from vit_plugin.evaluation.fewshot import fewshot_linear_eval, format_results
    train_x, train_y = _load_split(args.data_root, 'train')
    test_x, test_y = _load_split(args.data_root, 'test')
    torch.manual_seed(0)
    random_backbone = MODELS.build(dict(type='vit_plugin.ViT', arch=dict(mpp_model.backbone.arch_settings),
                                        img_size=mpp_model.backbone.img_size,
                                        patch_size=mpp_model.backbone.patch_size))
    random_backbone.init_weights()
    out = {}
    for name, backbone in (('mpp', mpp_model.backbone), ('random_init', random_backbone)):
        results = fewshot_linear_eval(_features(backbone, train_x), train_y, _features(backbone, test_x), test_y,
                                      shots=args.shots, seed=0, num_classes=10)
        out[name] = format_results(results)
    return out


def _plot_loss(ax, results):
    loss = np.array(results['mpp']['loss'])
    window = max(1, len(loss) // 40)
    smooth = np.convolve(loss, np.ones(window) / window, mode='valid')
    ax.plot(np.arange(len(smooth)) + window, smooth, color='tab:purple', label='MPP loss (train)')
    ax.axhline(results['marginal_entropy'], color='gray', ls='--',
               label=f'colour prior only ({results["marginal_entropy"]:.2f})')
    ax.set(xlabel='pre-training iteration', ylabel='cross-entropy (nats)', title='MPP pre-training',
           ylim=(0, min(7, float(loss.max()) + 0.2)))
    ax.legend()


def plot(results, path):
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    with_loss = 'loss' in results['mpp']
    fig, axes = plt.subplots(1, 2 if with_loss else 1, figsize=(10 if with_loss else 5, 3.8), squeeze=False)
    ax_acc = axes[0, -1]
    if with_loss:
        _plot_loss(axes[0, 0], results)
    for name, color in (('ft-mpp', 'tab:purple'), ('scratch', 'tab:orange')):
        runs = results['runs'][name]
        acc = np.array([r['top1'] for r in runs])
        steps = runs[0]['steps']
        label = 'MPP init' if name == 'ft-mpp' else 'random init'
        ax_acc.plot(steps, acc.mean(0), marker='o', color=color, label=f'{label} (mean of {len(runs)})')
        if len(runs) > 1:
            ax_acc.fill_between(steps, acc.min(0), acc.max(0), color=color, alpha=0.2)
    ax_acc.set(xlabel='supervised iteration (batch 64)', ylabel='test top-1 (%)',
               title='digits: fine-tuning vs scratch, same recipe')
    ax_acc.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def marginal_entropy(data_root, patch_size):
    """Cross-entropy of the best context-free guess: the colour-class frequencies of the training set."""
    from vit_plugin.models.selfsup.targets import mean_color_target
    images, _ = _load_split(data_root, 'train')
    target = mean_color_target(images * 127.5 + 127.5, patch_size).flatten()
    freq = torch.bincount(target, minlength=512).double()
    freq = freq[freq > 0] / freq.sum()
    return float(-(freq * freq.log()).sum())


def main():
    args = parse_args()
    import vit_plugin  # noqa: F401  (registers components; the runners import it again via custom_imports)
    from vit_plugin.datasets.digits import prepare_digits_dataset
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    os.makedirs(args.work_dir, exist_ok=True)
    prepare_digits_dataset(args.data_root, img_size=32)

    results = dict(args=vars(args))
    results['mpp'], mpp_model = load_pretrained(args) if args.mpp_checkpoint else pretrain(args)
    results['marginal_entropy'] = marginal_entropy(args.data_root, mpp_model.backbone.patch_size)
    results['fewshot'] = fewshot(args, mpp_model)
    results['runs'] = {'ft-mpp': [], 'scratch': []}
    for seed in args.seeds:
        results['runs']['ft-mpp'].append(finetune(args, seed, results['mpp']['checkpoint']))
        results['runs']['scratch'].append(finetune(args, seed))
    with open(osp.join(args.work_dir, 'results.json'), 'w') as f:
        json.dump(_portable(results), f, indent=1)
    plot(results, osp.join(args.work_dir, 'comparison.png'))

    if 'loss' in results['mpp']:
        tail = max(1, len(results['mpp']['loss']) // 10)
        print(f"MPP: loss {np.mean(results['mpp']['loss'][:10]):.3f} (first 10 iters) -> "
              f"{np.mean(results['mpp']['loss'][-tail:]):.3f} (last {tail}); colour prior only "
              f"{results['marginal_entropy']:.3f}; {results['mpp']['seconds']:.0f} s")
    for name, runs in results['runs'].items():
        finals = [r['top1'][-1] for r in runs]
        print(f'{name}: final test top-1 {np.mean(finals):.2f} (runs: {finals}); curve '
              f"{np.mean([r['top1'] for r in runs], 0).round(2).tolist()} at {runs[0]['steps']}")
    for name, res in results['fewshot'].items():
        print(f'few-shot linear, {name}: {res}')
    print(f'written: {args.work_dir}/results.json, comparison.png')


if __name__ == '__main__':
    main()
