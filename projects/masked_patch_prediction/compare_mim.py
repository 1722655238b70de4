"""MPP beside mmpretrain's MAE and MaskFeat on the embedded digits, in one command.

1. **Pre-training.** Each method pre-trains the same encoder (``configs/_tiny_vit.py``: width 64,
   4 blocks, 4 heads, MLP 128, patch 4 on 32 px) on the digits' training split without labels, with
   the same data, augmentation, optimiser, schedule and batch, once per seed: our MPP
   (``mpp_tiny-vit_digits.py``), mmpretrain's MAE (``mae_tiny-vit_digits.py``) and MaskFeat
   (``maskfeat_tiny-vit_digits.py``). MAE's and MaskFeat's encoders are converted to our ViT
   (``tools/convert_checkpoint.py --src-format mmpretrain_mim``: decoder, mask token and HOG buffers
   dropped).
2. **The MPP study's downstream code, unchanged** (``study.py``): supervised training at 1, 5, 10,
   25 labelled images per class and all labels from each encoder (the one fine-tuning config; only
   ``init_cfg`` differs), and the closed-form few-shot probe of the frozen features; mean +- std
   over the seeds.
3. **Two baselines:** training from scratch with the same recipe, and from scratch for as many
   iterations as pre-training plus fine-tuning (matched compute; both at batch 64).

Every arm's images seen (iterations x batch) and wall-clock are recorded. Writes ``comparison.json``
(relative paths only) and ``comparison.png`` into the work directory and prints the table::

    python projects/masked_patch_prediction/compare_mim.py                   # 3 seeds, ~50 min on 2 idle cores
    python projects/masked_patch_prediction/compare_mim.py --budget toy      # seconds, for tests (or tiny)
"""
import argparse
import json
import os.path as osp
import time

import numpy as np

import study
from study import ROOT

#: ``full``: the comparison; ``toy``: every step with a few iterations (tests). Pre-training is shorter
#: than the MPP study's 3,000 iterations so that the whole command fits in under an hour on 2 cores
#: (the estimate behind it: README.md, "Beside MAE and MaskFeat").
BUDGETS = dict(
    full=dict(pretrain_iters=800, ft_iters=300, seeds=[0, 1, 2], labels=[1, 5, 10, 25, None], shots=[1, 5, 10, 25]),
    toy=dict(pretrain_iters=4, ft_iters=3, seeds=[0], labels=[1, None], shots=[1, 2]),
)
BUDGETS['tiny'] = BUDGETS['toy']  # the same smallest budget under the other name users reach for

#: Pre-training methods: key -> (name in tables, config in configs/, needs conversion to our ViT).
METHODS = {
    'mpp': ('MPP', 'mpp_tiny-vit_digits.py', False),
    'mae': ('MAE', 'mae_tiny-vit_digits.py', True),
    'maskfeat': ('MaskFeat', 'maskfeat_tiny-vit_digits.py', True),
}
#: Rows of the table, in order: key -> name.
ARMS = {'scratch': 'scratch', 'scratch_matched': 'scratch, matched compute',
        **{key: name for key, (name, _, _) in METHODS.items()}}


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--budget', choices=sorted(BUDGETS), default='full')
    parser.add_argument('--work-dir', default=osp.join(ROOT, 'work_dirs', 'mim_comparison'))
    parser.add_argument('--data-root', default=osp.join(ROOT, 'data', 'digits'))
    return parser.parse_args()


def encoder_checkpoint(run, convert):
    """The checkpoint whose ``backbone.`` weights are our ViT: the MPP runner's own, or the converted
    MAE / MaskFeat encoder (written next to the runner's). Returns (path, conversion summary or None)."""
    if not convert:
        return run['checkpoint'], None
    from vit_plugin.converters.convert_file import convert_checkpoint_file
    dst = osp.join(osp.dirname(run['checkpoint']), 'encoder_vit_plugin.pth')
    report, _ = convert_checkpoint_file(run['checkpoint'], dst, src_format='mmpretrain_mim', show_progress=False)
    return dst, dict(loaded=len(report.loaded), dropped=report.dropped, notes=report.notes)


def pretraining(args, budget):
    """Every method once per seed: {method: {seed: checkpoint}} and the results entry."""
    checkpoints, entries = {}, {}
    for key, (_, config, convert) in METHODS.items():
        checkpoints[key], runs = {}, []
        for seed in budget['seeds']:
            run = study.pretrain(config, args.work_dir, args.data_root, budget['pretrain_iters'], seed=seed,
                                 name=f'{key}-seed{seed}')
            checkpoints[key][seed], conversion = encoder_checkpoint(run, convert)
            tail = run['loss'][-max(1, len(run['loss']) // 20):]
            runs.append(dict(seed=seed, loss=run['loss'], final_loss=float(np.mean(tail)), seconds=run['seconds'],
                             images=run['images'], checkpoint=checkpoints[key][seed], conversion=conversion))
            del run  # the model: one at a time in memory
        entries[key] = dict(config=osp.join(study.CONFIGS, config), runs=runs)
    return checkpoints, dict(iters=budget['pretrain_iters'], methods=entries)


def probes(args, budget, checkpoints):
    """Few-shot probe of every method's frozen encoders and of random initialisations."""
    from mmengine.config import Config
    tiny = Config.fromfile(osp.join(study.CONFIGS, '_tiny_vit.py'))
    out = {'random_init': study.probe_over_seeds({s: study.random_backbone(tiny, s) for s in budget['seeds']},
                                                  args.data_root, budget['shots'])}
    for key, per_seed in checkpoints.items():
        out[key] = study.probe_over_seeds({s: study.load_backbone(c) for s, c in per_seed.items()}, args.data_root,
                                          budget['shots'])
    return out


def label_efficiency(args, budget, checkpoints):
    """Supervised runs of every arm: the methods and scratch for ``ft_iters``, the matched-compute
    scratch for ``pretrain_iters + ft_iters``."""
    ft, matched = budget['ft_iters'], budget['pretrain_iters'] + budget['ft_iters']
    common = (args.work_dir, args.data_root)
    table = {'scratch': dict(iters=ft, top1=study.label_efficiency(*common, ft, budget['seeds'], budget['labels'],
                                                                   prefix='scratch')),
             'scratch_matched': dict(iters=matched, top1=study.label_efficiency(
                 *common, matched, budget['seeds'], budget['labels'], prefix='scratch_matched'))}
    for key, per_seed in checkpoints.items():
        table[key] = dict(iters=ft, top1=study.label_efficiency(*common, ft, budget['seeds'], budget['labels'],
                                                                checkpoints=per_seed, prefix=f'ft-{key}'))
    return table


def cost(results):
    """Per arm: images seen and wall-clock per seed (pre-training + one fine-tuning per label count),
    and in total."""
    out = {}
    for arm in ARMS:
        runs = results['pretraining']['methods'].get(arm, {}).get('runs', [])
        eff = results['label_efficiency'][arm]['top1']
        ft_images = next(iter(eff.values()))['images']
        ft_seconds = float(np.mean([v['seconds'] for v in eff.values()]))
        pre_images = runs[0]['images'] if runs else 0
        pre_seconds = float(np.mean([r['seconds'] for r in runs])) if runs else 0.
        seeds = len(results['settings']['seeds'])
        out[arm] = dict(pretrain_images=pre_images, pretrain_seconds=pre_seconds,
                        finetune_images=ft_images, finetune_seconds=ft_seconds,
                        images_per_label_count=pre_images + ft_images,
                        seconds_per_label_count=pre_seconds + ft_seconds,
                        total_seconds=seeds * (pre_seconds + len(eff) * ft_seconds))
    return out


def print_table(results):
    eff, probe, spent = results['label_efficiency'], results['fewshot'], results['cost']
    shots = list(probe['random_init'])
    labels = list(eff['scratch']['top1'])
    cell = '{mean:6.2f} +- {std:5.2f}'
    print(f"\nTest top-1 (%), mean +- std over seeds {results['settings']['seeds']}; pre-training "
          f"{results['pretraining']['iters']} iterations, fine-tuning {eff['scratch']['iters']} "
          f"(matched compute: {eff['scratch_matched']['iters']})")
    header = [f'probe {k}-shot' for k in shots] + [f'ft {k}/class' for k in labels]
    print(f"{'':<26}" + ''.join(f'{h:>17}' for h in header))
    for arm, name in ARMS.items():
        # Neither scratch arm has pre-trained features: both rows' probe is that of the random init.
        features = probe['random_init'] if arm.startswith('scratch') else probe[arm]
        row = [cell.format(**features[k]) for k in shots] + [cell.format(**eff[arm]['top1'][k]) for k in labels]
        print(f'{name:<26}' + ''.join(f'{c:>17}' for c in row))
    print('\nCost per seed and label count: images seen (iterations x batch 64) and wall-clock')
    print(f"{'':<26}{'pre-training':>24}{'fine-tuning':>24}{'together':>24}{'arm total':>12}")
    for arm, name in ARMS.items():
        c = spent[arm]
        print(f"{name:<26}" + ''.join(f"{c[i]:>12,d} {c[s]:>8.1f} s  " for i, s in (
            ('pretrain_images', 'pretrain_seconds'), ('finetune_images', 'finetune_seconds'),
            ('images_per_label_count', 'seconds_per_label_count'))) + f"{c['total_seconds'] / 60:>8.1f} min")


def main():
    args = parse_args()
    budget = BUDGETS[args.budget]
    start = study.prepare(args.work_dir, args.data_root)
    results = dict(budget=args.budget, settings=dict(budget))
    checkpoints, results['pretraining'] = pretraining(args, budget)
    results['fewshot'] = probes(args, budget, checkpoints)
    results['label_efficiency'] = label_efficiency(args, budget, checkpoints)
    results['cost'] = cost(results)
    results['seconds'] = time.time() - start
    with open(osp.join(args.work_dir, 'comparison.json'), 'w') as f:
        json.dump(study.portable(results), f, indent=1)

    import plots
    plots.mim_comparison(results, osp.join(args.work_dir, 'comparison.png'), ARMS)
    print_table(results)
    print(f"\nwritten: {study.relative(args.work_dir)}/comparison.json, comparison.png; "
          f"{results['seconds'] / 60:.1f} min")


if __name__ == '__main__':
    main()
