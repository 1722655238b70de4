"""Figures of the MPP study, drawn from its ``results.json`` content, and of the comparison with MAE and
MaskFeat (``comparison.json``)."""
import numpy as np

COLORS = {'mpp': 'tab:purple', 'scratch': 'tab:orange', 'random_init': 'tab:orange'}


def _pyplot():
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    return plt


def label_efficiency(results, path):
    """Test top-1 against labelled images per class: fine-tuned from MPP / from scratch (solid), and the
    few-shot probe of the frozen features (dashed); error bars are the std over seeds."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(5.6, 4))
    eff = results['label_efficiency']['top1']
    keys = list(eff['mpp'])
    # "all" sits at the full per-class count on the log axis
    xs = [eff['mpp'][k]['train_images'] / 10 if k == 'all' else int(k) for k in keys]
    for arm, label in (('mpp', 'fine-tuned from MPP'), ('scratch', 'trained from scratch')):
        ax.errorbar(xs, [eff[arm][k]['mean'] for k in keys], yerr=[eff[arm][k]['std'] for k in keys],
                    color=COLORS[arm], marker='o', capsize=3, label=label)
    for arm, label in (('mpp', 'few-shot probe, MPP features'), ('random_init', 'few-shot probe, random features')):
        probe = results['fewshot'][arm]
        ax.errorbar([int(k) for k in probe], [v['mean'] for v in probe.values()], yerr=[v['std'] for v in probe.values()],
                    color=COLORS[arm], marker='s', ls='--', capsize=3, alpha=0.8, label=label)
    ax.set_xscale('log')
    ax.set_xticks(xs)
    ax.set_xticklabels([k for k in keys])
    ax.set(xlabel='labelled images per class', ylabel='test top-1 (%)',
           title=f"digits, tiny ViT: {results['label_efficiency']['ft_iters']} supervised iterations per run")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _smooth(values):
    values = np.asarray(values)
    window = max(1, len(values) // 40)
    return np.arange(len(values) - window + 1) + window, np.convolve(values, np.ones(window) / window, mode='valid')


def pretraining(results, path):
    """Left: MPP loss curves of every seed against the colour-frequency floor. Right: the ablations'
    few-shot accuracy (if run)."""
    plt = _pyplot()
    has_ablations = 'ablations' in results
    fig, axes = plt.subplots(1, 2 if has_ablations else 1, figsize=(11 if has_ablations else 5.5, 4), squeeze=False)
    ax = axes[0, 0]
    pre = results['pretraining']
    for run in pre['runs']:
        ax.plot(*_smooth(run['loss']), label=f"MPP loss, seed {run['seed']}")
    ax.axhline(pre['marginal_entropy'], color='gray', ls='--', label=f"colour frequencies only ({pre['marginal_entropy']:.2f})")
    ax.set(xlabel='pre-training iteration (batch 64)', ylabel='cross-entropy on corrupted patches (nats)',
           title='MPP pre-training (3-bit mean colour, 50%)')
    ax.legend(fontsize=8)
    if has_ablations:
        ax = axes[0, 1]
        variants = results['ablations']['variants']
        shots = list(next(iter(variants.values()))['fewshot'])
        width = 0.8 / len(variants)
        for i, (name, v) in enumerate(variants.items()):
            ax.bar(np.arange(len(shots)) + i * width, [v['fewshot'][k]['mean'] for k in shots], width,
                   yerr=[v['fewshot'][k]['std'] for k in shots], capsize=2, label=name)
        probe = results['fewshot']['random_init']
        for j, k in enumerate(shots):
            if k in probe:
                ax.hlines(probe[k]['mean'], j - 0.1, j + 0.8, colors='black', linestyles=':',
                          label='random features' if j == 0 else None)
        ax.set_xticks(np.arange(len(shots)) + 0.4 - width / 2)
        ax.set_xticklabels([f'{k}-shot' for k in shots])
        ax.set(ylabel='few-shot test top-1 (%)', title='ablations (seed 0): targets and corruption rate')
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


#: Colours of the comparison's arms (the MPP study's purple and orange kept).
ARM_COLORS = {'scratch': 'tab:orange', 'scratch_matched': 'tab:brown', 'mpp': 'tab:purple', 'mae': 'tab:blue',
              'maskfeat': 'tab:green', 'random_init': 'tab:orange'}


def mim_comparison(results, path, arms):
    """``compare_mim.py``'s figure. Left: fine-tuned test top-1 against labelled images per class for
    every arm. Right: the few-shot probe of each method's frozen features and of random features.
    Error bars are the std over seeds; ``arms`` maps result keys to legend names."""
    plt = _pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    eff = results['label_efficiency']
    keys = list(eff['scratch']['top1'])
    # "all" sits at the full per-class count on the log axis
    xs = [eff['scratch']['top1'][k]['train_images'] / 10 if k == 'all' else int(k) for k in keys]
    for arm, name in arms.items():
        top1 = eff[arm]['top1']
        left.errorbar(xs, [top1[k]['mean'] for k in keys], yerr=[top1[k]['std'] for k in keys], marker='o',
                      capsize=3, color=ARM_COLORS.get(arm), ls=':' if arm == 'scratch_matched' else '-',
                      label=f"{name} ({eff[arm]['iters']} it.)")
    left.set_xscale('log')
    left.set_xticks(xs)
    left.set_xticklabels(keys)
    left.set(xlabel='labelled images per class', ylabel='test top-1 (%)',
             title=f"fine-tuned (pre-training {results['pretraining']['iters']} it.)")
    probe = results['fewshot']
    for arm, name in [('random_init', 'random features')] + [(a, n) for a, n in arms.items() if a in probe]:
        shots = list(probe[arm])
        right.errorbar([int(k) for k in shots], [probe[arm][k]['mean'] for k in shots],
                       yerr=[probe[arm][k]['std'] for k in shots], marker='s', ls='--', capsize=3,
                       color=ARM_COLORS.get(arm), label=name)
    right.set_xscale('log')
    right.set_xticks([int(k) for k in probe['random_init']])
    right.set_xticklabels(list(probe['random_init']))
    right.set(xlabel='shots per class', title='few-shot linear probe of frozen features')
    for ax in (left, right):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
