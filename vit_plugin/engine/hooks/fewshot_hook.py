"""Few-shot linear evaluation every N training iterations (the paper's on-the-fly evaluation)."""
from typing import Optional, Union

from mmengine.evaluator import Evaluator
from mmengine.hooks import Hook
from mmengine.logging import print_log

from vit_plugin.evaluation import run_fewshot_eval
from vit_plugin.registry import HOOKS


@HOOKS.register_module()
class FewShotEvalHook(Hook):
    """Log few-shot linear top-1 accuracy (``fewshot/{k}shot_top1``) of the frozen model while it pre-trains.

    Args:
        support_dataloader (dict | DataLoader): Labelled pool the k-shot subsets are drawn from; give it
            a deterministic test pipeline and a non-shuffling sampler.
        query_dataloader (dict | DataLoader): The evaluation set.
        interval (int): Evaluate every ``interval`` training iterations. Defaults to 1000.
        metric (dict): Config of the metric. Defaults to ``dict(type='vit_plugin.FewShotLinearMetric')``.
        feature_stage (str, optional): 'backbone', 'neck' or 'pre_logits', for models whose
            ``extract_feat`` takes a stage. Defaults to 'pre_logits'.
        token_pool (str): 'cls' or 'mean', for models that return token sequences. Defaults to 'cls'.
        before_train (bool): Also evaluate before the first iteration. Defaults to False.
        at_end (bool): Also evaluate after the last iteration. Defaults to True.
    """
    priority = 'LOW'

    def __init__(self,
                 support_dataloader: Union[dict, object],
                 query_dataloader: Union[dict, object],
                 interval: int = 1000,
                 metric: Optional[dict] = None,
                 feature_stage: Optional[str] = 'pre_logits',
                 token_pool: str = 'cls',
                 before_train: bool = False,
                 at_end: bool = True):
        if interval < 1:
            raise ValueError(f'interval must be a positive number of iterations, got {interval}')
        self.support_dataloader = support_dataloader
        self.query_dataloader = query_dataloader
        self.interval = interval
        self.metric_cfg = metric or dict(type='vit_plugin.FewShotLinearMetric')
        self.feature_stage = feature_stage
        self.token_pool = token_pool
        self.eval_before_train = before_train
        self.at_end = at_end
        self._evaluator = None
        self.last_metrics = {}

    def _setup(self, runner):
        if self._evaluator is not None:
            return
        if isinstance(self.support_dataloader, dict):
            self.support_dataloader = runner.build_dataloader(self.support_dataloader, seed=runner.seed)
        if isinstance(self.query_dataloader, dict):
            self.query_dataloader = runner.build_dataloader(self.query_dataloader, seed=runner.seed)
        if not isinstance(self.metric_cfg, dict):
            raise TypeError(f'metric must be a metric config dict, got {type(self.metric_cfg).__name__}')
        self._evaluator = Evaluator(dict(self.metric_cfg))
        meta = getattr(self.query_dataloader.dataset, 'metainfo', None)
        if meta is not None:
            self._evaluator.dataset_meta = meta

    def evaluate(self, runner, step: Optional[int] = None) -> dict:
        """Run the evaluation now and log it at ``step`` (default: iterations done so far); returns the metrics."""
        self._setup(runner)
        metrics = run_fewshot_eval(runner.model, self.support_dataloader, self.query_dataloader, self._evaluator,
                                   self.feature_stage, self.token_pool)
        step = runner.iter if step is None else step
        summary = ', '.join(f'{name}: {value:.2f}' for name, value in metrics.items() if name.endswith('_top1'))
        print_log(f'Few-shot linear evaluation at iteration {step}: {summary}', logger='current')
        for name, value in metrics.items():
            runner.message_hub.update_scalar(name, value)
        runner.visualizer.add_scalars(metrics, step=step)
        self.last_metrics = dict(metrics)
        return metrics

    def before_train(self, runner) -> None:
        if self.eval_before_train:
            self.evaluate(runner)

    def after_train_iter(self, runner, batch_idx: int, data_batch=None, outputs=None) -> None:
        if self.every_n_train_iters(runner, self.interval) or (self.at_end and self.is_last_train_iter(runner)):
            # runner.iter counts iterations before this one: the model has now trained runner.iter + 1.
            self.evaluate(runner, step=runner.iter + 1)
