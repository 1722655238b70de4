"""A two-layer MLP, its data and metric, and a config training them with mmengine's runner, for the
tests of the XLA path on torch_xla's CPU backend.

Importing this module needs no torch_xla (the current stack has none): only :func:`run_xla` reaches
it, through :mod:`vit_plugin.xla`.
"""
import os.path as osp

import torch
import torch.nn as nn
from mmengine.config import Config
from mmengine.evaluator import BaseMetric
from mmengine.model import BaseModel
from mmengine.registry import DATASETS, METRICS, MODELS, RUNNERS


@MODELS.register_module(force=True)
class XLAToyNet(BaseModel):
    """Linear-GELU-Linear classifier; ``item_in_step`` reads a device value mid-step and slices the
    batch with it (a data-dependent shape), the classic way to make XLA recompile."""

    def __init__(self, width=16, item_in_step=False):
        super().__init__(data_preprocessor=dict(type='BaseDataPreprocessor'))
        self.net = nn.Sequential(nn.Linear(8, width), nn.GELU(), nn.Linear(width, 3))
        self.item_in_step = item_in_step

    def forward(self, inputs, labels, mode='tensor'):
        x = self.net(inputs)
        if self.item_in_step:
            n = int(x.detach().abs().sum().item() * 1000) % 2 + 1
            x, labels = x[:n], labels[:n]
        if mode == 'loss':
            return dict(loss=nn.functional.cross_entropy(x, labels))
        if mode == 'predict':
            return x.argmax(-1)
        return x


@METRICS.register_module(force=True)
class XLAToyAccuracy(BaseMetric):

    def process(self, data_batch, data_samples):
        hits = torch.stack(data_samples).cpu() == data_batch['labels']  # one tensor per sample
        self.results.append((hits.sum().item(), len(hits)))

    def compute_metrics(self, results):
        return dict(acc=sum(r[0] for r in results) / sum(r[1] for r in results))


@DATASETS.register_module(force=True)
class XLAToyData(torch.utils.data.Dataset):

    def __init__(self, n=40):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 8, generator=g)
        self.y = torch.randint(0, 3, (n, ), generator=g)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return dict(inputs=self.x[i], labels=self.y[i])


def toy_cfg(work_dir, width, n=40, log_interval=3, max_epochs=3, validate=False, **model):
    """An mmengine config training :class:`XLAToyNet` on :class:`XLAToyData` by epochs, with AdamW,
    gradient clipping, a learning rate that changes every iteration and a checkpoint every epoch.

    Args:
        work_dir: The run's work dir; its base name is the experiment name.
        width (int): Hidden width of the network. A width no other run of the process used gives
            graphs new to the process's compilation cache.
        n (int): Training samples. Defaults to 40.
        log_interval (int): Logger interval in iterations. Defaults to 3.
        max_epochs (int): Defaults to 3.
        validate (bool): Add a validation loop with :class:`XLAToyAccuracy`. Defaults to False.
        **model: Further arguments of :class:`XLAToyNet`.
    """
    val = dict(
        val_dataloader=dict(dataset=dict(type='XLAToyData', n=24), batch_size=12, num_workers=0,
                            sampler=dict(type='DefaultSampler', shuffle=False),
                            collate_fn=dict(type='default_collate')),
        val_cfg=dict(), val_evaluator=dict(type='XLAToyAccuracy')) if validate else {}
    return Config(dict(
        **val,
        model=dict(type='XLAToyNet', width=width, **model),
        work_dir=str(work_dir),
        experiment_name=osp.basename(str(work_dir)),
        train_dataloader=dict(dataset=dict(type='XLAToyData', n=n), batch_size=8, num_workers=0,
                              sampler=dict(type='DefaultSampler', shuffle=True),
                              collate_fn=dict(type='default_collate')),
        train_cfg=dict(by_epoch=True, max_epochs=max_epochs, val_interval=1),
        optim_wrapper=dict(optimizer=dict(type='AdamW', lr=1e-2, weight_decay=0.05),
                           clip_grad=dict(max_norm=1.0)),
        # The learning rate changes every iteration: it must not cause recompilations.
        param_scheduler=[dict(type='LinearLR', start_factor=0.1, by_epoch=False, begin=0, end=5),
                         dict(type='CosineAnnealingLR', by_epoch=False, begin=5, end=15)],
        default_hooks=dict(logger=dict(type='LoggerHook', interval=log_interval),
                           checkpoint=dict(type='CheckpointHook', interval=1)),
        randomness=dict(seed=0), launcher='none'))


def run_xla(cfg):
    """Train ``cfg`` (e.g. :func:`toy_cfg`) with mmengine's runner on the XLA device."""
    from vit_plugin.xla import to_xla_config  # registers the XLA loops and wrappers, which only a run needs

    runner = RUNNERS.build(to_xla_config(cfg, launcher='none'))
    runner.train()
    return runner
