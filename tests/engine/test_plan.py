"""The run plan (vit_plugin.engine.plan): computed from the config and the environment without changing
either, applied once (planning its result again changes nothing), the same for the XLA launcher, and
the ``custom_keys`` of the optimizer checked against the model's parameters."""
import logging.handlers
import os.path as osp

import pytest
import torch.nn as nn
from mmengine.config import Config

from helpers.common import REPO
from vit_plugin.engine.config_edits import MISSING
from vit_plugin.engine.plan import RunEnv, RunSetupError, plan_run

FT = osp.join(REPO, 'configs', 'vit_l16_in21k_ft_in1k_384.py')  # global batch 512, EMA, on vit_plugin's runtime


def finetune_config(**keys):
    cfg = Config.fromfile(FT)
    cfg.merge_from_dict(dict(work_dir='/nonexistent', **keys))
    return cfg


def test_the_plan_leaves_its_input_alone_and_lists_each_change():
    cfg = finetune_config(train_dataloader=dict(batch_size=16, pin_memory=True))
    before = cfg.to_dict()
    plan = plan_run(cfg, RunEnv(world_size=8, device='cpu', launcher='mpi'))
    assert cfg.to_dict() == before
    changes = {change.path: (change.before, change.after) for change in plan.changes}
    assert plan.accumulative_counts == 4  # 512 = 16 x 8 processes x 4
    assert changes['optim_wrapper.accumulative_counts'] == (MISSING, 4)
    assert changes['train_cfg.max_iters'] == (20000, 80000)
    assert changes['custom_hooks.0.interval'][1] == 4  # the EMA moves once per optimizer step
    assert changes['train_dataloader.pin_memory'] == (True, False)  # no GPU: torch would warn and pin nothing
    assert changes['env_cfg.dist_cfg.backend'][1] == 'gloo'
    text = plan.describe()
    assert 'Run plan: 8 process(es)' in text
    assert '[global batch] train_cfg.max_iters: 20000 -> 80000' in text
    assert '[device defaults] train_dataloader.pin_memory: True -> False' in text


def test_applied_once_planning_the_result_again_changes_nothing():
    cfg = finetune_config(train_dataloader=dict(batch_size=16))
    env = RunEnv(world_size=8, device='cuda', launcher='mpi', gpus=8)
    applied = plan_run(cfg, env).apply(cfg)
    assert applied.optim_wrapper.accumulative_counts == 4 and applied.optim_wrapper.optimizer.fused is True
    assert applied.train_dataloader.pin_memory is True and applied.train_cfg.max_iters == 80000
    again = plan_run(applied, env)
    assert again.changes == () and again.accumulative_counts == 4
    with pytest.raises(RunSetupError, match='prepared for another number of processes than 4'):
        plan_run(applied, RunEnv(world_size=4, device='cuda', launcher='mpi', gpus=8))


def test_the_xla_launchers_plan_converts_and_accumulates_in_one_plan():
    from vit_plugin.xla.launch import plan_xla_run, xla_env
    cfg = Config.fromfile(osp.join(REPO, 'configs', 'vit_demo_digits.py'))
    cfg.merge_from_dict(dict(global_batch_size=256, train_cfg=dict(max_epochs=2, val_interval=1)))
    plan = plan_xla_run(cfg, xla_env('xla', world_size=2))  # in each of 2 replicas
    xla = plan.apply(cfg)
    assert xla.runner_type == 'vit_plugin.FlexibleRunner' and xla.strategy.type == 'vit_plugin.XLAStrategy'
    assert xla.optim_wrapper.type == 'vit_plugin.XLAOptimWrapper' and xla.optim_wrapper.accumulative_counts == 2
    assert xla.default_hooks.preemption.type == 'vit_plugin.PreemptionHook'
    assert '[xla] optim_wrapper.type' in plan.describe()
    # vit_plugin.FlexibleRunner.from_cfg plans the config it is given: the replicas are not known there
    assert plan_run(xla, RunEnv.from_process(xla, flexible=True)).changes == ()


def test_switches_and_a_runner_of_mmengine_build_nothing_of_the_plan():
    cfg = finetune_config(global_batch_size=None, device_defaults=False, preemption=False, input_norm_check=False)
    assert plan_run(cfg, RunEnv(world_size=2, device='cpu', launcher='pytorch')).changes == ()


# ------------------------------------------------------------------------------- paramwise_cfg.custom_keys
def tiny_classifier():
    from mmengine.registry import DefaultScope
    from mmpretrain.registry import MODELS
    import vit_plugin  # noqa: F401
    with DefaultScope.overwrite_default_scope('mmpretrain'):  # whatever scope an earlier test left current
        return MODELS.build(dict(type='mmpretrain.ImageClassifier', backbone=dict(
            type='vit_plugin.ViT', arch=dict(embed_dims=16, num_layers=2, num_heads=2, mlp_dims=32), img_size=16,
            patch_size=8), neck=None, head=dict(type='mmpretrain.LinearClsHead', num_classes=3, in_channels=16)))


def test_a_custom_key_that_matches_no_parameter_is_named_with_the_closest_paths():
    from mmengine.logging import MMLogger
    from vit_plugin.engine.optimizers.custom_keys import UnmatchedCustomKeyError, check_custom_keys
    model = tiny_classifier()
    optim = dict(optimizer=dict(type='AdamW', lr=1e-3), paramwise_cfg=dict(custom_keys={
        'backbone.layers.0': dict(lr_mult=0.1), '.cls_token': dict(decay_mult=0.0)}))
    records = logging.handlers.BufferingHandler(capacity=100)
    logger = MMLogger.get_current_instance()
    logger.addHandler(records)
    try:
        assert check_custom_keys(model, optim) == ['backbone.layers.0']
    finally:
        logger.removeHandler(records)
    warnings = [r.getMessage() for r in records.buffer if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "custom_keys['backbone.layers.0']" in warnings[0]
    assert 'closest parameter paths: backbone.blocks.0' in warnings[0]
    optim['paramwise_cfg']['strict_custom_keys'] = True
    with pytest.raises(UnmatchedCustomKeyError, match=r"backbone\.layers\.0.*backbone\.blocks\.0"):
        check_custom_keys(model, optim)


def test_the_runner_checks_custom_keys_when_it_builds_the_optimizer(tmp_path, digits_root):
    from mmengine.registry import RUNNERS
    from vit_plugin.engine.optimizers.custom_keys import UnmatchedCustomKeyError
    cfg = Config.fromfile(osp.join(REPO, 'configs', 'vit_demo_digits.py'))  # mmengine's default constructor
    cfg.merge_from_dict(dict(
        work_dir=str(tmp_path), val_dataloader=None, val_cfg=None, val_evaluator=None,
        model=dict(backbone=dict(arch=dict(embed_dims=16, num_layers=2, num_heads=2, mlp_dims=32)),
                   head=dict(in_channels=16)),
        train_dataloader=dict(num_workers=0, persistent_workers=False, dataset=dict(data_root=digits_root)),
        optim_wrapper=dict(paramwise_cfg=dict(custom_keys={'backbone.layers.0': dict(lr_mult=0.1)},
                                              strict_custom_keys=True))))
    runner = RUNNERS.build(cfg)
    with pytest.raises(UnmatchedCustomKeyError, match='backbone.blocks.0'):
        runner.train()
    assert isinstance(runner.model, nn.Module) and runner.iter == 0
