"""Few-shot linear evaluation as an mmengine metric and validation loop, through :func:`run_fewshot_eval`.

See docs/evaluation.md#few-shot-linear-evaluation."""
from typing import Dict, Iterable, List, Optional, Sequence, Union

import numpy as np
import torch
from mmengine.dist import get_world_size
from mmengine.evaluator import BaseMetric, Evaluator
from mmengine.runner import BaseLoop

from vit_plugin.registry import LOOPS, METRICS
from .features import iter_feature_records
from .fewshot import DEFAULT_L2_GRID, fewshot_linear_eval, format_results

SPLITS = ('support', 'query')


@METRICS.register_module()
class FewShotLinearMetric(BaseMetric):
    """Few-shot linear top-1 (``fewshot/{k}shot_top1``, ``fewshot/{k}shot_log2_l2``) of feature records.

    Args:
        shots (Sequence[int]): Shot counts. Defaults to (1, 5, 10, 25).
        num_holdout_per_class (int): Support samples per class held out to choose the regulariser.
            Defaults to 2.
        l2_grid (Sequence[float], optional): Candidate regularisers. None: 2^-10 ... 2^19.
        seed (int): Seed of the class-balanced draw. Defaults to 0.
        num_draws (int): Draws (seeds ``seed ...``) whose accuracies are averaged. Defaults to 1.
        num_classes (int, optional): None: from ``dataset_meta['classes']``, else 1 + the largest label.
        standardize (bool): Standardise features with support statistics. Defaults to True.
        collect_device (str): 'cpu' or 'gpu'. Defaults to 'cpu'.
        prefix (str, optional): Metric name prefix. Defaults to None, i.e. 'fewshot'.
    """
    default_prefix = 'fewshot'

    def __init__(self,
                 shots: Sequence[int] = (1, 5, 10, 25),
                 num_holdout_per_class: int = 2,
                 l2_grid: Optional[Sequence[float]] = None,
                 seed: int = 0,
                 num_draws: int = 1,
                 num_classes: Optional[int] = None,
                 standardize: bool = True,
                 collect_device: str = 'cpu',
                 prefix: Optional[str] = None):
        super().__init__(collect_device=collect_device, prefix=prefix)
        if num_draws < 1:
            raise ValueError(f'num_draws must be >= 1, got {num_draws}')
        self.shots = tuple(sorted({int(k) for k in shots}))
        self.num_holdout_per_class = num_holdout_per_class
        self.l2_grid = tuple(l2_grid) if l2_grid is not None else DEFAULT_L2_GRID
        self.seed = seed
        self.num_draws = num_draws
        self.num_classes = num_classes
        self.standardize = standardize

    def process(self, data_batch, data_samples: Sequence[dict]) -> None:
        for record in data_samples:
            if not isinstance(record, dict) or 'feat' not in record or record.get('split') not in SPLITS:
                raise ValueError('FewShotLinearMetric needs feature records dict(feat, gt_label, split, '
                                 'sample_idx) with split in ("support", "query"), not model predictions; '
                                 'run it through vit_plugin.FewShotValLoop, vit_plugin.FewShotEvalHook or '
                                 'tools/fewshot_eval.py')
            self.results.append(dict(feat=torch.as_tensor(record['feat']).float().cpu(),
                                     gt_label=int(record['gt_label']), split=record['split'],
                                     sample_idx=int(record['sample_idx'])))

    def _num_classes(self, labels: np.ndarray) -> int:
        if self.num_classes is not None:
            return self.num_classes
        classes = (self.dataset_meta or {}).get('classes')
        return len(classes) if classes else int(labels.max()) + 1

    def compute_metrics(self, results: List[dict]) -> Dict[str, float]:
        # Distributed samplers pad the last batch with repeated samples: keep each image once.
        unique = {(r['split'], r['sample_idx']): r for r in results}
        by_split = {s: [r for key, r in sorted(unique.items()) if key[0] == s] for s in SPLITS}
        for split, records in by_split.items():
            if not records:
                raise ValueError(f'few-shot evaluation got no {split} features; give it a non-empty '
                                 f'{split} dataloader')
        feats = {s: torch.stack([r['feat'] for r in rs]) for s, rs in by_split.items()}
        labels = {s: np.array([r['gt_label'] for r in rs]) for s, rs in by_split.items()}
        num_classes = self._num_classes(np.concatenate(list(labels.values())))
        draws = [
            format_results(fewshot_linear_eval(feats['support'], labels['support'], feats['query'], labels['query'],
                                               shots=self.shots, seed=self.seed + d,
                                               num_holdout_per_class=self.num_holdout_per_class,
                                               l2_grid=self.l2_grid, num_classes=num_classes,
                                               standardize=self.standardize)) for d in range(self.num_draws)
        ]
        return {name: float(np.mean([d[name] for d in draws])) for name in draws[0]}


def run_fewshot_eval(model: torch.nn.Module,
                     support_dataloader: Iterable,
                     query_dataloader: Iterable,
                     evaluator: Union[Evaluator, BaseMetric],
                     feature_stage: Optional[str] = 'pre_logits',
                     token_pool: str = 'cls') -> Dict[str, float]:
    """Frozen features of both loaders (``model`` in eval mode, mode restored) -> the evaluator's metrics.

    Same result on every rank; ``feature_stage``, ``token_pool`` as :func:`iter_feature_records`."""
    if isinstance(evaluator, BaseMetric):
        evaluator = Evaluator([evaluator])
    was_training = model.training
    model.eval()
    processed = 0
    try:
        for split, loader in (('support', support_dataloader), ('query', query_dataloader)):
            for data_batch, records in iter_feature_records(model, loader, split, feature_stage, token_pool):
                evaluator.process(records, data_batch)
                processed += len(records)
    finally:
        model.train(was_training)
    # Every rank processes the same number of (padded) samples; keep them all, the metric drops
    # the duplicated padding by sample index.
    return evaluator.evaluate(processed * get_world_size())


@LOOPS.register_module()
class FewShotValLoop(BaseLoop):
    """Validation loop reporting few-shot linear accuracy instead of running the model's head.

    Args:
        runner (Runner): The runner.
        dataloader (DataLoader | dict): The query set.
        evaluator (Evaluator | dict | list): Holds a ``vit_plugin.FewShotLinearMetric``.
        support_dataloader (DataLoader | dict): The support pool (test pipeline).
        feature_stage, token_pool: See :func:`iter_feature_records`.
    """

    def __init__(self, runner, dataloader, evaluator, support_dataloader, feature_stage: Optional[str] = 'pre_logits',
                 token_pool: str = 'cls'):
        super().__init__(runner, dataloader)
        self.evaluator = runner.build_evaluator(evaluator) if isinstance(evaluator, (dict, list)) else evaluator
        if isinstance(support_dataloader, dict):
            support_dataloader = runner.build_dataloader(support_dataloader, seed=runner.seed)
        self.support_dataloader = support_dataloader
        meta = getattr(self.dataloader.dataset, 'metainfo', None)
        if meta is not None:
            self.evaluator.dataset_meta = meta
        self.feature_stage = feature_stage
        self.token_pool = token_pool

    def run(self) -> dict:
        self.runner.call_hook('before_val')
        self.runner.call_hook('before_val_epoch')
        metrics = run_fewshot_eval(self.runner.model, self.support_dataloader, self.dataloader, self.evaluator,
                                   self.feature_stage, self.token_pool)
        self.runner.call_hook('after_val_epoch', metrics=metrics)
        self.runner.call_hook('after_val')
        return metrics
