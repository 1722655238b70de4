"""FSDP2 (``tools/train.py --fsdp``): sharded training on CPU with 2 Gloo processes through
``tools/dist_train.sh``, sharded (DCP) checkpoints, pre-emption, resumption across process counts
(2 -> 1: ``--resume`` in the pre-empted work dir; 1 -> 2) and consolidation into an ordinary checkpoint.

The reference is a plain single-process run (no FSDP) of the same 2-block ViT on the same global
batch (1 x 32 vs 2 x 16 images, deterministic data, no dropout): the mean of the two processes'
losses must equal its loss at every iteration. Every run averages its weights with mmengine's
``EMAHook`` (``ShardedEMAHook`` under ``--fsdp``), so each checkpoint also carries the average through
pre-emption and resharding, and it must equal the plain run's. The single-process runs (the reference
and the 2 -> 1 resumption) train in the test process; the 2-process jobs are subprocesses.

Also: the ``--fsdp`` flag's config, the wrap policy (one unit per transformer block), and a save under an
existing name that keeps a complete checkpoint at every step.
"""
import os
import os.path as osp
import shutil
import signal
import subprocess

import numpy as np
import pytest
import torch
import torch.nn as nn
from torch.distributed.checkpoint import FileSystemReader

from helpers.common import REPO, free_port, read_losses, run_env
from helpers import warm_runs
from helpers.in_process import helper_modules
from helpers.training_runs import INTERVAL, MAX_ITERS, dist_cmd, iter_config, losses_list, run, signal_when
from vit_plugin.cli.consolidate_checkpoint import main as consolidate
from vit_plugin.engine import fsdp2
from vit_plugin.engine.checkpointing import COMPLETE_MARKER, checkpoint_problem, find_resumable_checkpoint

ATOL = 1e-5


def config(path, data_root, delay=0.0, in_process=False, **kwargs):
    """The iteration-based digits run of helpers/training_runs.py without dropout, with an EMA of the weights;
    ``in_process``: for a run in the test process (its hooks imported from ``helpers``, no pacing)."""
    base = iter_config(path.with_name(f'{path.stem}_base.py'), data_root, drop_rate=0.0, delay=delay, **kwargs)
    hooks = "[dict(type='LossRecorderHook'), dict(type='EMAHook', momentum=0.2, priority='ABOVE_NORMAL')]"
    if not in_process:
        hooks = hooks.replace("),", f"), dict(type='PacingHook', delay={delay}),", 1)
    imports = helper_modules(['loss_recorder'] if in_process else ['loss_recorder', 'pacing'], in_process)
    path.write_text(f"""
_base_ = [{base!r}]
custom_imports = dict(imports={imports!r}, allow_failed_imports=False)
custom_hooks = {hooks}
""")
    return str(path)


def mean_losses(ranks, iters):
    """The mean of the ranks' losses (``[{iteration: loss}]``, one per rank) at ``iters``."""
    return [(ranks[0][i] + ranks[1][i]) / 2 for i in iters]


def train_here(cfg, work_dir, *extra):
    """``tools/train.py`` in the test process on one thread, as the training subprocesses run
    (``OMP_NUM_THREADS=1``): its losses."""
    outcome = warm_runs.train_here(cfg, work_dir, *extra)
    assert outcome.code == 0, outcome.output[-4000:]
    return read_losses(work_dir)


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


# One set of runs, shared by the tests below, each started once: a plain single-process reference, a
# 2-process sharded job pre-empted between two checkpoints, one process resuming it in its work dir
# (--resume, no path: 2 -> 1), two processes resuming that one's checkpoint (1 -> 2), and every final
# checkpoint consolidated. Each test checks one claim, so one failing claim does not hide the others.
@pytest.fixture(scope='module')
def runs(tmp_path_factory, digits_root):
    """The folder of the runs and their configs (the plain, 2-process, paced 2-process and 1-process FSDP2
    runs)."""
    root = tmp_path_factory.mktemp('fsdp2')
    return dict(root=root, one=config(root / 'one.py', digits_root, in_process=True, batch_size=32),
                two=config(root / 'two.py', digits_root, batch_size=16),
                paced=config(root / 'paced.py', digits_root, batch_size=16, delay=0.3),
                one_fsdp=config(root / 'one_fsdp.py', digits_root, in_process=True, batch_size=32))


@pytest.fixture(scope='module')
def plain(runs):
    """The plain single-process run (no FSDP): its work dir and per-iteration losses."""
    work = runs['root'] / 'plain'
    return work, train_here(runs['one'], work)


@pytest.fixture(scope='module')
def preempted(runs):
    """2 processes, sharded; SIGUSR1 to rank 1 between two checkpoints (pre-emption under FSDP2): the work
    dir, the job's exit status and output, the first iteration it did not run, and each rank's losses."""
    work = runs['root'] / 'fsdp'
    proc = subprocess.Popen(dist_cmd(runs['paced'], work, '--fsdp'), env=dict(run_env(), PORT=str(free_port())),
                            cwd=REPO, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    status, output = signal_when(proc, work, after_iters=INTERVAL + 2, target='worker', signum=signal.SIGUSR1,
                                 rank=1)
    ranks = [read_losses(work, rank) for rank in (0, 1)]  # read now: the resumed run writes rank 0's again
    return work, status, output, max(ranks[0]) + 1, ranks


@pytest.fixture(scope='module')
def single(runs, preempted):
    """2 -> 1 process: ``--resume`` (no path) of the pre-empted job by one process, in its work dir (DCP
    reshards): the work dir and the losses of the resumed iterations."""
    work = preempted[0]
    return work, train_here(runs['one_fsdp'], work, '--fsdp', '--resume')


@pytest.fixture(scope='module')
def again(runs, single):
    """1 -> 2 processes: the single process's checkpoint of iteration 16 is sharded again."""
    again = runs['root'] / 'again'
    run(dist_cmd(runs['two'], again, '--fsdp', '--resume', str(single[0] / f'iter_{2 * INTERVAL}.pth')),
        env=dict(run_env(), PORT=str(free_port())))
    return again


@pytest.fixture(scope='module')
def consolidated(single, again):
    """Each run's final checkpoint consolidated: [(run dir, the file consolidate returned)]."""
    return [(run_dir, consolidate([str(run_dir / f'iter_{MAX_ITERS}.pth')])) for run_dir in (single[0], again)]


@pytest.mark.slow
def test_fsdp2_plain_reference_run_records_every_iteration(plain):
    _, reference = plain
    assert sorted(reference) == list(range(MAX_ITERS))


@pytest.mark.slow
def test_fsdp2_signal_to_one_process_stops_the_job_between_two_checkpoints(preempted):
    _, status, output, stopped, _ = preempted
    assert status != 0 and 'exitcode  : 75' in output, output[-4000:]
    assert INTERVAL + 2 <= stopped < MAX_ITERS


@pytest.mark.slow
def test_fsdp2_two_processes_match_one_process_until_the_stop(plain, preempted):
    _, reference = plain
    _, _, _, stopped, ranks = preempted
    np.testing.assert_allclose(mean_losses(ranks, range(stopped)), losses_list(reference, range(stopped)),
                               rtol=0, atol=ATOL)


@pytest.mark.slow
def test_fsdp2_checkpoint_at_the_stop_is_complete_and_sharded_in_halves(runs, preempted):
    work, _, _, stopped, _ = preempted
    sharded = work / f'iter_{stopped}.pth'
    assert osp.isdir(sharded) and osp.isfile(sharded / COMPLETE_MARKER) and checkpoint_problem(str(sharded)) is None
    fractions = shard_fractions(str(sharded))
    params = [name for name, _ in build_model(runs['two']).named_parameters()]
    assert len(params) == 32
    for name in params:  # every parameter and its Adam moments: about half in each process's file
        for key in (f'model.{name}', f'optim.state.{name}.exp_avg', f'optim.state.{name}.exp_avg_sq'):
            rank0, rank1 = fractions[key]
            assert 0.4 <= rank0 <= 0.6 and abs(rank0 + rank1 - 1) < 1e-9, (key, rank0, rank1)


@pytest.mark.slow
def test_fsdp2_one_process_resumes_the_preempted_job_with_the_uninterrupted_losses(plain, preempted, single):
    # --resume without a path takes the checkpoint written at the stop, whose shards two processes wrote.
    _, reference = plain
    _, _, _, stopped, _ = preempted
    _, resumed = single
    assert sorted(resumed) == list(range(stopped, MAX_ITERS))
    np.testing.assert_allclose(losses_list(resumed, sorted(resumed)), losses_list(reference, sorted(resumed)),
                               rtol=0, atol=ATOL)


@pytest.mark.slow
def test_fsdp2_two_processes_reshard_a_one_process_checkpoint(plain, again):
    _, reference = plain
    ranks = [read_losses(again, rank) for rank in (0, 1)]
    assert sorted(ranks[0]) == sorted(ranks[1]) == list(range(2 * INTERVAL, MAX_ITERS))
    np.testing.assert_allclose(mean_losses(ranks, range(2 * INTERVAL, MAX_ITERS)),
                               losses_list(reference, range(2 * INTERVAL, MAX_ITERS)), rtol=0, atol=ATOL)


@pytest.mark.slow
def test_fsdp2_consolidated_checkpoints_hold_the_plain_runs_weights_and_average(plain, consolidated):
    # Each run's final checkpoint, consolidated, is an ordinary file in mmengine's EMA layout (state_dict
    # the average, ema_state_dict the trained weights) holding the plain run's values: the average came
    # through the pre-emption and 2 -> 1 (single, in the pre-empted job's work dir) and 1 -> 2 (again).
    work, _ = plain
    reference_ckpt = torch.load(work / f'iter_{MAX_ITERS}.pth', map_location='cpu', weights_only=False)
    name = 'backbone.blocks.0.attn.qkv.weight'
    moved = (reference_ckpt['state_dict'][name] - reference_ckpt['ema_state_dict'][f'module.{name}']).abs().max()
    assert moved > 1e-3  # the average differs from the trained weights: the comparison has teeth
    for run_dir, out in consolidated:
        assert out == str(run_dir / f'iter_{MAX_ITERS}_consolidated.pth')
        ours = torch.load(out, map_location='cpu', weights_only=True)
        assert ours['meta']['iter'] == MAX_ITERS
        for key in ('state_dict', 'ema_state_dict'):
            assert set(ours[key]) == set(reference_ckpt[key]), (run_dir.name, key)
            for param, value in reference_ckpt[key].items():
                np.testing.assert_allclose(ours[key][param].numpy(), value.numpy(), rtol=0, atol=1e-4,
                                           err_msg=f'{run_dir.name}: {key}[{param}]')


@pytest.mark.slow
def test_fsdp2_consolidated_checkpoint_loads_into_a_plain_model(runs, plain, consolidated):
    work, _ = plain
    reference_ckpt = torch.load(work / f'iter_{MAX_ITERS}.pth', map_location='cpu', weights_only=False)
    _, out = consolidated[-1]  # the 1 -> 2 run's
    ours = torch.load(out, map_location='cpu', weights_only=True)
    models = []
    for state in (ours['state_dict'], reference_ckpt['state_dict']):
        model = build_model(runs['two']).eval()
        assert not model.load_state_dict(state, strict=True).missing_keys
        models.append(model)
    images = torch.randn(4, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        a, b = (m(images, mode='tensor') for m in models)
    np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=0, atol=1e-4)


def test_fsdp_flag_selects_fsdp2_and_shards_ema():
    from mmengine.config import Config

    from vit_plugin.cli import train
    from vit_plugin.engine.runner import prepare_run

    args = train.parse_args([osp.join(REPO, 'configs', 'vit_b16_in21k.py'), '--fsdp', '--work-dir', '/nonexistent'])
    cfg = train.merge_args(Config.fromfile(args.config), args)
    assert cfg.runner_type == 'vit_plugin.FlexibleRunner' and cfg.strategy == dict(type='vit_plugin.FSDP2Strategy')

    # The fine-tuning config averages the weights with EMAHook: under FSDP2 the runner makes it the sharded
    # version, same settings.
    args = train.parse_args([osp.join(REPO, 'configs', 'vit_b16_in21k_ft_in1k_384.py'), '--fsdp',
                             '--cfg-options', 'global_batch_size=None'])  # the EMA's interval as written
    (ema, ) = [h for h in Config.fromfile(args.config).custom_hooks if 'EMAHook' in h['type']]
    cfg = prepare_run(train.merge_args(Config.fromfile(args.config), args), flexible=True, device='cpu')
    (sharded, ) = [h for h in cfg.custom_hooks if 'EMAHook' in h['type']]
    assert sharded == dict(ema, type='vit_plugin.ShardedEMAHook')


@pytest.mark.slow
def test_fsdp_wraps_one_unit_per_transformer_block():
    from mmengine.registry import FUNCTIONS

    from vit_plugin.models.backbones.vit import ViT
    from vit_plugin.models.layers import EncoderBlock
    policy = FUNCTIONS.get('vit_plugin.vit_block_wrap_policy')  # how vit_plugin.FSDP2Strategy finds it
    model = ViT(arch=dict(embed_dims=32, num_layers=3, num_heads=2, mlp_dims=64), img_size=32, patch_size=8)
    wrapped = [name for name, m in model.named_modules() if policy(m, recurse=False, nonwrapped_numel=0)]
    assert wrapped == ['blocks.0', 'blocks.1', 'blocks.2']
    assert all(policy(m, recurse=True, nonwrapped_numel=0) for m in model.modules())
    assert all(isinstance(model.get_submodule(n), EncoderBlock) for n in wrapped)


# ------------------------------------------------------------------------------------ FSDP2 saves
def test_fsdp2_save_under_an_existing_name_always_keeps_a_complete_checkpoint(tmp_path, monkeypatch):
    strategy = fsdp2.FSDP2Strategy(work_dir=str(tmp_path / 'logs'))
    strategy.model = nn.Linear(3, 2)
    work = tmp_path / 'work'
    work.mkdir()
    target = str(work / 'iter_8.pth')

    def save(iteration):
        strategy.save_checkpoint(target, save_optimizer=False, save_param_scheduler=False,
                                 extra_ckpt=dict(meta=dict(iter=iteration)))

    def meta_of(path):
        return torch.load(osp.join(path, fsdp2.EXTRA_FILE), weights_only=False)['meta']['iter']

    save(1)
    states = []  # at every rename and deletion: which complete checkpoint the work dir offers
    real_replace, real_rmtree = os.replace, shutil.rmtree

    def record(*args, **kwargs):
        found = find_resumable_checkpoint(str(work), warn=None)
        states.append(None if found is None else (osp.basename(found), meta_of(found)))

    def replace(src, dst):
        record()
        real_replace(src, dst)

    def rmtree(path, *args, **kwargs):
        record()
        real_rmtree(path, *args, **kwargs)

    monkeypatch.setattr(fsdp2.os, 'replace', replace)
    monkeypatch.setattr(fsdp2.shutil, 'rmtree', rmtree)
    strategy.model.weight.data.fill_(2.0)
    save(2)
    record()
    assert None not in states
    assert states[-1] == ('iter_8.pth', 2) and ('iter_8.pth.old', 1) in states
    assert sorted(os.listdir(work)) == ['iter_8.pth']

    # A crash between the two renames: the old checkpoint is complete under the aside name and --resume
    # takes it; the next save under the name clears it.
    def crash_on_commit(src, dst):
        if src.endswith('.part'):
            raise KeyboardInterrupt('killed')
        real_replace(src, dst)

    monkeypatch.setattr(fsdp2.os, 'replace', crash_on_commit)
    monkeypatch.setattr(fsdp2.shutil, 'rmtree', real_rmtree)
    with pytest.raises(KeyboardInterrupt):
        save(3)
    assert sorted(os.listdir(work)) == ['iter_8.pth.old', 'iter_8.pth.part']
    found = find_resumable_checkpoint(str(work), warn=None)
    assert osp.basename(found) == 'iter_8.pth.old' and meta_of(found) == 2 and checkpoint_problem(found) is None
    monkeypatch.setattr(fsdp2.os, 'replace', real_replace)
    save(4)
    assert sorted(os.listdir(work)) == ['iter_8.pth'] and meta_of(target) == 4
