"""FSDP2 (``tools/train.py --fsdp``): sharded training on CPU with 2 Gloo processes through
``tools/dist_train.sh``, sharded (DCP) checkpoints, pre-emption, resumption at 2 and 1 processes and
across them (2 -> 1, 1 -> 2), and consolidation into an ordinary checkpoint.

The reference is a plain single-process run (no FSDP) of the same 2-block ViT on the same global
batch (1 x 32 vs 2 x 16 images, deterministic data, no dropout): the mean of the two processes'
losses must equal its loss at every iteration. Every run averages its weights with mmengine's
``EMAHook`` (``ShardedEMAHook`` under ``--fsdp``), so each checkpoint also carries the average through
pre-emption and resharding, and it must equal the plain run's.
"""
import os.path as osp
import signal
import subprocess

import numpy as np
import pytest
import torch
from torch.distributed.checkpoint import FileSystemReader

from helpers.common import REPO, free_port, read_losses, run_env
from helpers.training_runs import (INTERVAL, MAX_ITERS, dist_cmd, iter_config, losses_list, run, signal_when,
                                   train_cmd)
from vit_plugin.apis.consolidate_checkpoint import main as consolidate
from vit_plugin.engine.checkpointing import COMPLETE_MARKER, checkpoint_problem

ATOL = 1e-5


def config(path, data_root, delay=0.0, **kwargs):
    """The iteration-based digits run of helpers/training_runs.py without dropout, with an EMA of the weights."""
    base = iter_config(path.with_name(f'{path.stem}_base.py'), data_root, drop_rate=0.0, delay=delay, **kwargs)
    path.write_text(f"""
_base_ = [{base!r}]
custom_hooks = [dict(type='LossRecorderHook'), dict(type='PacingHook', delay={delay}),
                dict(type='EMAHook', momentum=0.2, priority='ABOVE_NORMAL')]
""")
    return str(path)


def mean_losses(work, iters):
    ranks = [read_losses(work, rank) for rank in (0, 1)]
    return [(ranks[0][i] + ranks[1][i]) / 2 for i in iters]


def shard_fractions(checkpoint_dir):
    """{tensor name: [fraction of its values in the file of rank 0, of rank 1]} from the DCP metadata."""
    metadata = FileSystemReader(checkpoint_dir).read_metadata()
    fractions = {}
    for index, info in metadata.storage_data.items():
        tensor = metadata.state_dict_metadata[index.fqn]
        if not hasattr(tensor, 'chunks'):  # pickled non-tensor entries (optimizer hyper-parameters)
            continue
        chunk = next(c for c in tensor.chunks if tuple(c.offsets) == tuple(index.offset))
        rank = int(info.relative_path.split('_')[2])  # files are __<rank>_<n>.distcp
        fractions.setdefault(index.fqn, [0.0, 0.0])[rank] += chunk.sizes.numel() / tensor.size.numel()
    return fractions


def build_model(config_file):
    from mmengine.config import Config
    from mmengine.registry import DefaultScope
    from mmpretrain.registry import MODELS

    import vit_plugin  # noqa: F401  (registers the vit_plugin scope)
    # The test's hooks (custom_imports) live in tests/helpers; the model needs only vit_plugin. The
    # scope is the config's, whatever runner of another test set the current one.
    with DefaultScope.overwrite_default_scope('mmpretrain'):
        return MODELS.build(Config.fromfile(config_file, import_custom_modules=False).model)


@pytest.mark.slow
def test_fsdp2_two_processes_match_one_process_resume_and_keep_the_weight_average(tmp_path, digits_root):
    env = dict(run_env())
    plain = tmp_path / 'plain'
    run(train_cmd(config(tmp_path / 'one.py', digits_root, batch_size=32), plain))
    reference = read_losses(plain)
    assert sorted(reference) == list(range(MAX_ITERS))

    # 2 processes, sharded; SIGUSR1 to rank 1 between two checkpoints (pre-emption under FSDP2).
    two_cfg = config(tmp_path / 'two.py', digits_root, batch_size=16)
    paced = config(tmp_path / 'paced.py', digits_root, batch_size=16, delay=0.3)
    work = tmp_path / 'fsdp'
    proc = subprocess.Popen(dist_cmd(paced, work, '--fsdp'), env=dict(env, PORT=str(free_port())), cwd=REPO,
                            text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    status, output = signal_when(proc, work, after_iters=INTERVAL + 2, target='worker', signum=signal.SIGUSR1,
                                 rank=1)
    assert status != 0 and 'exitcode  : 75' in output, output[-4000:]
    stopped = max(read_losses(work, 0)) + 1
    assert INTERVAL + 2 <= stopped < MAX_ITERS
    np.testing.assert_allclose(mean_losses(work, range(stopped)), losses_list(reference, range(stopped)),
                               rtol=0, atol=ATOL)
    sharded = work / f'iter_{stopped}.pth'
    assert osp.isdir(sharded) and osp.isfile(sharded / COMPLETE_MARKER) and checkpoint_problem(str(sharded)) is None
    fractions = shard_fractions(str(sharded))
    params = [name for name, _ in build_model(two_cfg).named_parameters()]
    assert len(params) == 32
    for name in params:  # every parameter and its Adam moments: about half in each process's file
        for key in (f'model.{name}', f'optim.state.{name}.exp_avg', f'optim.state.{name}.exp_avg_sq'):
            rank0, rank1 = fractions[key]
            assert 0.4 <= rank0 <= 0.6 and abs(rank0 + rank1 - 1) < 1e-9, (key, rank0, rank1)

    # --resume (no path) continues from the sharded checkpoint with the uninterrupted losses.
    run(dist_cmd(two_cfg, work, '--fsdp', '--resume'), env=dict(env, PORT=str(free_port())))
    after = sorted(read_losses(work, 0))
    assert after == list(range(stopped, MAX_ITERS))
    np.testing.assert_allclose(mean_losses(work, after), losses_list(reference, after), rtol=0, atol=ATOL)

    # 2 -> 1 process: one process resumes the 2-process checkpoint of iteration 8 (DCP reshards).
    single = tmp_path / 'single'
    run(train_cmd(config(tmp_path / 'one_fsdp.py', digits_root, batch_size=32), single, '--fsdp',
                  '--resume', str(work / f'iter_{INTERVAL}.pth')))
    resumed = read_losses(single)
    assert sorted(resumed) == list(range(INTERVAL, MAX_ITERS))
    np.testing.assert_allclose(losses_list(resumed, sorted(resumed)), losses_list(reference, sorted(resumed)),
                               rtol=0, atol=ATOL)

    # 1 -> 2 processes: the single process's checkpoint of iteration 16 is sharded again.
    again = tmp_path / 'again'
    run(dist_cmd(two_cfg, again, '--fsdp', '--resume', str(single / f'iter_{2 * INTERVAL}.pth')),
        env=dict(env, PORT=str(free_port())))
    assert sorted(read_losses(again, 0)) == list(range(2 * INTERVAL, MAX_ITERS))
    np.testing.assert_allclose(mean_losses(again, range(2 * INTERVAL, MAX_ITERS)),
                               losses_list(reference, range(2 * INTERVAL, MAX_ITERS)), rtol=0, atol=ATOL)

    # Each run's final checkpoint, consolidated, is an ordinary file in mmengine's EMA layout (state_dict
    # the average, ema_state_dict the trained weights) holding the plain run's values: the average came
    # through the pre-emption (work), 2 -> 1 (single) and 1 -> 2 (again). It loads into a plain model.
    reference_ckpt = torch.load(plain / f'iter_{MAX_ITERS}.pth', map_location='cpu', weights_only=False)
    name = 'backbone.blocks.0.attn.qkv.weight'
    moved = (reference_ckpt['state_dict'][name] - reference_ckpt['ema_state_dict'][f'module.{name}']).abs().max()
    assert moved > 1e-3  # the average differs from the trained weights: the comparison has teeth
    for run_dir in (work, single, again):
        out = consolidate([str(run_dir / f'iter_{MAX_ITERS}.pth')])
        assert out == str(run_dir / f'iter_{MAX_ITERS}_consolidated.pth')
        ours = torch.load(out, map_location='cpu', weights_only=True)
        assert ours['meta']['iter'] == MAX_ITERS
        for key in ('state_dict', 'ema_state_dict'):
            assert set(ours[key]) == set(reference_ckpt[key]), (run_dir.name, key)
            for param, value in reference_ckpt[key].items():
                np.testing.assert_allclose(ours[key][param].numpy(), value.numpy(), rtol=0, atol=1e-4,
                                           err_msg=f'{run_dir.name}: {key}[{param}]')

    models = []
    for state in (ours['state_dict'], reference_ckpt['state_dict']):
        model = build_model(two_cfg).eval()
        assert not model.load_state_dict(state, strict=True).missing_keys
        models.append(model)
    images = torch.randn(4, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        a, b = (m(images, mode='tensor') for m in models)
    np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=0, atol=1e-4)


def test_fsdp_flag_selects_fsdp2_and_shards_ema():
    from mmengine.config import Config

    from vit_plugin.apis import train

    args = train.parse_args([osp.join(REPO, 'configs', 'vit_b16_in21k.py'), '--fsdp', '--work-dir', '/nonexistent'])
    cfg = train.merge_args(Config.fromfile(args.config), args)
    assert cfg.runner_type == 'FlexibleRunner' and cfg.strategy == dict(type='vit_plugin.FSDP2Strategy')

    # The fine-tuning config averages the weights with EMAHook: under FSDP2 its sharded version, same settings.
    args = train.parse_args([osp.join(REPO, 'configs', 'vit_b16_in21k_ft_in1k_384.py'), '--fsdp'])
    (ema, ) = [h for h in Config.fromfile(args.config).custom_hooks if 'EMAHook' in h['type']]
    cfg = train.merge_args(Config.fromfile(args.config), args)
    (sharded, ) = [h for h in cfg.custom_hooks if 'EMAHook' in h['type']]
    assert sharded == dict(ema, type='vit_plugin.ShardedEMAHook')
