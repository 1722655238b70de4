"""Test helper imported into SPMD training subprocesses via ``custom_imports``.

``SpmdProbeHook`` writes ``<work_dir>/spmd_probe.json`` after the first iteration: the mesh size, and
for every parameter the partition spec the strategy chose, XLA's sharding annotation and the shape of
the piece each device holds; and the same for the AdamW moments, so a test can check that weights
and optimizer state are split as stated.
"""
import json
import os.path as osp

from mmengine.hooks import Hook
from mmengine.registry import HOOKS

from vit_plugin.xla import spmd


@HOOKS.register_module()
class SpmdProbeHook(Hook):
    priority = 'LOWEST'

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None):
        strategy = getattr(runner, 'strategy', None)  # mmengine's plain Runner (eager runs) has none
        if runner.iter != 0 or getattr(strategy, 'mesh', None) is None:
            return
        params, moments = {}, {}
        optimizer = runner.optim_wrapper.optimizer
        for name, param in runner.model.named_parameters():
            params[name] = dict(spec=strategy.param_specs[name], full=list(param.shape),
                                sharding=spmd.sharding_of(param), local=list(spmd.shard_shape(param)))
            state = optimizer.state.get(param, {})
            if 'exp_avg' in state:
                moments[name] = list(spmd.shard_shape(state['exp_avg']))
        with open(osp.join(runner.work_dir, 'spmd_probe.json'), 'w') as f:
            json.dump(dict(mesh=int(strategy.mesh.size()), params=params, exp_avg_local=moments), f)
