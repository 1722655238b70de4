"""Few-shot linear evaluation of a checkpoint on any classification dataset config (paper, Section 4.1).

    python tools/fewshot_eval.py CONFIG CHECKPOINT [--shots 1 5 10 25] [--out results.json]

The k-shot support subsets (class-balanced, seeded) and a held-out split choosing the regulariser are
drawn from the config's train dataset, read through the test pipeline (no augmentation); top-1 is
measured on the config's test dataset. Frozen features are the model's pre-logits representation.
"""
import copy
import json

from vit_plugin.cli.common import base_parser
from vit_plugin.evaluation import FewShotLinearMetric, run_fewshot_eval
from vit_plugin.evaluation.model_loading import load_model


def _innermost_dataset(dataset_cfg):
    # Dataset wrappers (RepeatDataset, ClassBalancedDataset ...) nest the real dataset under `dataset`.
    while 'pipeline' not in dataset_cfg and isinstance(dataset_cfg.get('dataset'), dict):
        dataset_cfg = dataset_cfg['dataset']
    return dataset_cfg


def build_loader_cfgs(cfg, support_split: str, query_split: str, batch_size: int, num_workers: int):
    """Dataloader configs of the support pool (test pipeline, no shuffling) and the query set."""
    loaders = {}
    for role, split in (('support', support_split), ('query', query_split)):
        key = f'{split}_dataloader'
        if not cfg.get(key):
            raise ValueError(f'the config has no {key}; choose another split with --{role}-split')
        loaders[role] = copy.deepcopy(cfg[key])
    query_pipeline = _innermost_dataset(loaders['query']['dataset']).get('pipeline')
    if query_pipeline is None:
        raise ValueError(f'the {query_split} dataset of the config has no pipeline')
    _innermost_dataset(loaders['support']['dataset'])['pipeline'] = copy.deepcopy(query_pipeline)
    for loader in loaders.values():
        loader.update(batch_size=batch_size, num_workers=num_workers, persistent_workers=num_workers > 0,
                      sampler=dict(type='DefaultSampler', shuffle=False))
        loader.pop('batch_sampler', None)
    return loaders['support'], loaders['query']


def main(argv=None):
    parser = base_parser(__doc__.splitlines()[0])
    parser.add_argument('--shots', type=int, nargs='+', default=[1, 5, 10, 25], help='(default: 1 5 10 25)')
    parser.add_argument('--seed', type=int, default=0, help='seed of the k-shot draw (default: 0)')
    parser.add_argument('--num-draws', type=int, default=1,
                        help='average over this many draws (seeds seed, seed+1, ...) (default: 1)')
    parser.add_argument('--holdout', type=int, default=2,
                        help='support images per class held out to choose the regulariser (default: 2)')
    parser.add_argument('--support-split', default='train', help='dataloader supplying the shots (default: train)')
    parser.add_argument('--query-split', default='test', help='dataloader measured on (default: test)')
    parser.add_argument('--feature-stage', default='pre_logits', choices=('backbone', 'neck', 'pre_logits'),
                        help='representation probed, for mmpretrain classifiers (default: pre_logits)')
    parser.add_argument('--token-pool', default='cls', choices=('cls', 'mean'),
                        help='how token sequences become vectors (default: cls)')
    parser.add_argument('--batch-size', type=int, default=64, help='(default: 64)')
    parser.add_argument('--num-workers', type=int, default=2, help='(default: 2)')
    parser.add_argument('--out', default=None, help='write the metrics as JSON here')
    args = parser.parse_args(argv)

    from mmengine.runner import Runner

    model, _, cfg = load_model(args.config, args.checkpoint, args.device, args.cfg_options)
    support_cfg, query_cfg = build_loader_cfgs(cfg, args.support_split, args.query_split, args.batch_size,
                                               args.num_workers)
    support, query = Runner.build_dataloader(support_cfg), Runner.build_dataloader(query_cfg)
    metric = FewShotLinearMetric(shots=args.shots, num_holdout_per_class=args.holdout, seed=args.seed,
                                 num_draws=args.num_draws)
    metric.dataset_meta = getattr(query.dataset, 'metainfo', None)
    metrics = run_fewshot_eval(model, support, query, metric, args.feature_stage, args.token_pool)
    print(f'Few-shot linear evaluation of {args.checkpoint} ({len(support.dataset)} support pool / '
          f'{len(query.dataset)} query images, {args.num_draws} draw(s), seed {args.seed}):')
    print('| shots | top-1 (%) | log2 l2 |')
    print('|---|---|---|')
    for k in sorted(set(args.shots)):
        print(f"| {k} | {metrics[f'fewshot/{k}shot_top1']:.2f} | {metrics[f'fewshot/{k}shot_log2_l2']:.1f} |")
    if args.out:
        with open(args.out, 'w') as f:
            json.dump(dict(config=args.config, checkpoint=args.checkpoint, seed=args.seed, num_draws=args.num_draws,
                           metrics=metrics), f, indent=1)
        print(f'wrote {args.out}')
    return metrics
