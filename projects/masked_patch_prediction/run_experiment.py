"""The MPP study on the embedded digits, in one command: does masked patch prediction pay off?

1. **Pre-training.** MPP (the paper's objective: 50 % of the patches corrupted, 3-bit mean colour
   targets) of the tiny ViT on the digits' training split without labels, once per seed. Recorded: the
   loss curve against the colour-frequency floor (the best guess that sees nothing), and the loss on
   the same test patches with the neighbours visible and with the whole image masked.
2. **Label efficiency.** For every seed and 1, 5, 10, 25 labelled images per class and all labels:
   supervised training from the MPP backbone and from random initialisation with the same recipe and
   number of iterations (the subsets are class-balanced, seeded and nested: ``LabelSubsetDataset``),
   plus the paper's closed-form few-shot probe of the frozen features.
3. **Ablations** (seed 0, judged by the few-shot probe as in the paper's Appendix B.1.2): the three
   targets (3-bit mean colour, 4x4 grid of 3-bit colours, L2 on the pixels) and 15 % vs 50 %
   corruption.

Writes ``results.json`` (relative paths only), ``label_efficiency.png``, ``pretraining.png`` and
``predictions.png`` into the work directory and prints the tables::

    python projects/masked_patch_prediction/run_experiment.py                    # the README's numbers
    python projects/masked_patch_prediction/run_experiment.py --budget toy       # seconds, for tests
"""
import argparse
import json
import os.path as osp
import time

import numpy as np

import study
from study import ROOT

#: ``full`` is what the README reports; ``toy`` runs every step with a few iterations (tests).
BUDGETS = dict(
    full=dict(mpp_iters=3000, ft_iters=300, seeds=[0, 1, 2], labels=[1, 5, 10, 25, None], shots=[1, 5, 10, 25]),
    toy=dict(mpp_iters=4, ft_iters=3, seeds=[0], labels=[1, None], shots=[1, 2]),
)

#: The paper's ablations, as overrides of the MPP config's model (the first is the main objective).
VARIANTS = {
    'mean colour, 50%': {},
    '4x4 colours, 50%': dict(head=dict(target='downsized_4x4_3bit')),
    'pixels L2, 50%': dict(head=dict(target='pixel_l2')),
    'mean colour, 15%': dict(corrupt_ratio=0.15),
}


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--budget', choices=sorted(BUDGETS), default='full')
    parser.add_argument('--work-dir', default=osp.join(ROOT, 'work_dirs', 'mpp_study'))
    parser.add_argument('--data-root', default=osp.join(ROOT, 'data', 'digits'))
    parser.add_argument('--skip-ablations', action='store_true', help='only pre-training and label efficiency')
    return parser.parse_args()


def pretraining(args, budget, results):
    """Main objective once per seed: curves, context use, few-shot probe against random init."""
    entries, models = [], {}
    for seed in budget['seeds']:
        run = study.pretrain_mpp(args.work_dir, args.data_root, budget['mpp_iters'], seed=seed, name=f'mpp-seed{seed}')
        models[seed] = run
        entries.append(dict(seed=seed, loss=run['loss'], seconds=run['seconds'], checkpoint=run['checkpoint'],
                            context=study.context_use(run['model'], args.data_root, seed=seed)))
    floor = study.marginal_entropy(args.data_root, run['model'].backbone.patch_size)
    results['pretraining'] = dict(iters=budget['mpp_iters'], marginal_entropy=floor, runs=entries)
    return models


def probes(args, budget, models, results):
    """Few-shot probe of the frozen MPP backbones (one per pre-training seed) and of random inits."""
    shots = budget['shots']
    results['fewshot'] = {
        'mpp': study.probe_over_seeds({seed: run['model'].backbone for seed, run in models.items()}, args.data_root,
                                      shots),
        'random_init': study.probe_over_seeds(
            {seed: study.random_backbone(run['config'].model, seed) for seed, run in models.items()}, args.data_root,
            shots)}


def label_efficiency(args, budget, models, results):
    table = {arm: study.label_efficiency(args.work_dir, args.data_root, budget['ft_iters'], budget['seeds'],
                                         budget['labels'], checkpoints=checkpoints)
             for arm, checkpoints in (('mpp', {s: models[s]['checkpoint'] for s in budget['seeds']}),
                                      ('scratch', None))}
    results['label_efficiency'] = dict(ft_iters=budget['ft_iters'], top1=table)


def ablations(args, budget, models, results):
    """Every variant pre-trained with seed 0 and probed with three draws of the shots."""
    draws = [0, 1, 2] if len(budget['seeds']) > 1 else [0]
    out = {}
    for i, (name, overrides) in enumerate(VARIANTS.items()):
        run = models[0] if i == 0 else study.pretrain_mpp(args.work_dir, args.data_root, budget['mpp_iters'], seed=0,
                                                            name=f'ablation-{i}', **overrides)
        out[name] = dict(overrides=overrides, final_loss=float(np.mean(run['loss'][-max(1, len(run['loss']) // 20):])),
                         seconds=run['seconds'],
                         fewshot=study.fewshot_probe(run['model'].backbone, args.data_root, budget['shots'], draws))
    results['ablations'] = dict(probe_draws=draws, variants=out)


def print_tables(results):
    pre = results['pretraining']
    print(f"\nMPP pre-training, {pre['iters']} iterations; colour-frequency floor {pre['marginal_entropy']:.3f} nats")
    for run in pre['runs']:
        tail = run['loss'][-max(1, len(run['loss']) // 20):]
        print(f"  seed {run['seed']}: final loss {np.mean(tail):.3f}; test patches with neighbours visible "
              f"{run['context']['neighbours_visible']:.3f} vs whole image masked {run['context']['all_masked']:.3f}; "
              f"{run['seconds']:.0f} s")
    eff = results['label_efficiency']['top1']
    print('\nTest top-1 (%), fine-tuned (mean +- std over seeds)\nlabels/class  ' +
          '  '.join(f'{k:>13}' for k in eff['mpp']))
    for arm in eff:
        print(f'{arm:<13} ' + '  '.join(f"{v['mean']:6.2f} +- {v['std']:4.2f}" for v in eff[arm].values()))
    print('\nFew-shot probe of frozen features, test top-1 (%)')
    for name, per_shot in results['fewshot'].items():
        print(f'{name:<13} ' + '  '.join(f"{k}-shot {v['mean']:6.2f} +- {v['std']:4.2f}" for k, v in per_shot.items()))
    if 'ablations' in results:
        print('\nAblations (seed 0; few-shot probe over draws)')
        for name, v in results['ablations']['variants'].items():
            print(f'{name:<18} loss {v["final_loss"]:.3f}  ' + '  '.join(
                f"{k}-shot {s['mean']:6.2f} +- {s['std']:4.2f}" for k, s in v['fewshot'].items()))


def main():
    args = parse_args()
    budget = BUDGETS[args.budget]
    start = study.prepare(args.work_dir, args.data_root)
    results = dict(budget=args.budget, settings={k: v for k, v in budget.items()})
    models = pretraining(args, budget, results)
    probes(args, budget, models, results)
    label_efficiency(args, budget, models, results)
    if not args.skip_ablations:
        ablations(args, budget, models, results)
    results['seconds'] = time.time() - start
    with open(osp.join(args.work_dir, 'results.json'), 'w') as f:
        json.dump(study.portable(results), f, indent=1)

    import plots
    plots.label_efficiency(results, osp.join(args.work_dir, 'label_efficiency.png'))
    plots.pretraining(results, osp.join(args.work_dir, 'pretraining.png'))
    import visualize
    visualize.render(models[budget['seeds'][0]]['checkpoint'], osp.join(args.work_dir, 'predictions.png'),
                     data_root=args.data_root)
    print_tables(results)
    print(f"\nwritten: {study.relative(args.work_dir)}/results.json, label_efficiency.png, pretraining.png, "
          f"predictions.png; {results['seconds'] / 60:.1f} min")


if __name__ == '__main__':
    main()
