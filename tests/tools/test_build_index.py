"""tools/build_index.py: the index of a config's tar shards, built once ahead of training, resumed after a
stop, and used by a 2-process run without scanning again; a build longer than the process group's
timeout is waited out by the other process (docs/data.md#the-index).

A module fixture writes the shards and the config and runs the command's ``main`` on a damaged shard
(it fails and keeps the good shards' scans), then again once the shard is fixed. One 2-process job
(Gloo, a 3 s timeout) then opens that index, and another one that it builds itself, slowly.
"""
import os
import os.path as osp
import shutil
import subprocess
import sys
import textwrap

import pytest
from mmengine.logging import MMLogger

from helpers.common import LogLines, free_port, run_env
from helpers.tar_shards import make_samples, write_wds
from vit_plugin.cli.build_index import main as build_index

PER_SHARD = (5, 4, 6, 5, 4)
PG_TIMEOUT_S = 3  # the process group's timeout in the 2-process job; the slow build takes longer
SLOW_S = 1.5  # per shard: 7.5 s in all

CONFIG = '''
train_dataloader = dict(batch_size=2, num_workers=0, dataset=dict(
    type='vit_plugin.TarShardDataset', data_root={root!r}, split='train', index_workers=1,
    pipeline=[dict(type='vit_plugin.LoadImageFromFile'), dict(type='mmpretrain.PackInputs')]))
'''

# A process of a 2-process job: opens the config's dataset (the index the command built), then the
# same shards with another index file, built in the job, SLOW_S seconds per shard; then a collective.
RANK = textwrap.dedent('''
    import datetime, logging, os, sys, time
    import torch.distributed as dist
    from mmengine.config import Config
    from mmengine.logging import MMLogger
    from vit_plugin.datasets import tar_index_build
    from vit_plugin.datasets.shard_dataset import TarShardDataset

    config, slow_index, slow_s, timeout_s = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4])
    logger = MMLogger.get_instance('rank', log_level='INFO')
    handler = logging.StreamHandler(sys.stdout)
    handler.setLevel(logging.INFO)
    logger.addHandler(handler)
    # Both processes meet here first (their imports may differ by more than the timeout), then form a
    # group whose collectives wait timeout_s at most.
    ready = os.path.join(os.path.dirname(slow_index), 'ready')
    open(f'{ready}{os.environ["RANK"]}', 'w').close()
    while not all(os.path.exists(f'{ready}{r}') for r in range(2)):
        time.sleep(0.05)
    dist.init_process_group('gloo', timeout=datetime.timedelta(seconds=timeout_s))
    cfg = Config.fromfile(config).train_dataloader.dataset
    kwargs = {k: v for k, v in cfg.items() if k not in ('type', 'pipeline')}
    built = TarShardDataset(**kwargs)
    print('BUILT', len(built), built.index_path, flush=True)
    scan = tar_index_build._run_task  # whichever process builds, each shard's scan takes slow_s more
    tar_index_build._run_task = lambda task: time.sleep(slow_s) or scan(task)
    print('SLOW START', time.time(), flush=True)
    slow = TarShardDataset(**kwargs, index_file=slow_index)
    sizes = [None, None]
    dist.all_gather_object(sizes, len(slow))
    print('SLOW END', time.time(), sizes, flush=True)
    dist.barrier()
    dist.destroy_process_group()
''')


@pytest.fixture(scope='module')
def built(tmp_path_factory):
    """The shards and config; the command run with shard 3 cut short (it fails), then with it fixed."""
    root = tmp_path_factory.mktemp('shards')
    names = write_wds(str(root), make_samples(sum(PER_SHARD), seed=3), PER_SHARD)
    config = str(root / 'config.py')
    with open(config, 'w') as f:
        f.write(CONFIG.format(root=str(root)))
    bad = osp.join(str(root), names[3])
    shutil.copy(bad, bad + '.good')
    with open(bad, 'r+b') as f:
        f.truncate(1000)
    logs = LogLines()
    MMLogger.get_instance('test_build_index', log_level='INFO').addHandler(logs)
    with pytest.raises(SystemExit) as failed:
        build_index([config])
    parts_after_failure = sorted(n for n in os.listdir(root / '.vit_plugin_index') if n.endswith('.parts'))
    os.replace(bad + '.good', bad)
    first = len(logs.lines)
    build_index([config])
    return root, config, names, str(failed.value), parts_after_failure, logs.lines[first:]


@pytest.fixture(scope='module')
def job(built):
    """The 2-process job: its exit statuses and each process's output."""
    root, config, *_ = built
    script = str(root / 'rank.py')
    with open(script, 'w') as f:
        f.write(RANK)
    env = dict(run_env(), MASTER_ADDR='127.0.0.1', MASTER_PORT=str(free_port()), WORLD_SIZE='2')
    args = [sys.executable, script, config, str(root / 'slow.index'), str(SLOW_S), str(PG_TIMEOUT_S)]
    procs = [subprocess.Popen(args, env=dict(env, RANK=str(r), LOCAL_RANK=str(r)), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for r in range(2)]
    outs = [p.communicate(timeout=400)[0] for p in procs]
    return [p.returncode for p in procs], outs


def test_a_build_with_a_bad_shard_names_it_and_keeps_the_good_shards_scans(built):
    _, _, names, error, parts, _ = built
    assert error.startswith('ERROR: ') and f'{names[3]}: ' in error and 'truncated' in error
    assert len(parts) == 1


def test_the_command_then_scans_only_the_shard_that_was_fixed(built):
    root, _, _, _, _, lines = built
    text = '\n'.join(lines)
    assert f'{len(PER_SHARD) - 1} scanned by an earlier build' in text
    assert not [n for n in os.listdir(root / '.vit_plugin_index') if n.endswith('.parts')]  # the index holds all


def test_a_two_process_job_uses_the_built_index_without_scanning(built, job):
    root, *_ = built
    codes, outs = job
    assert codes == [0, 0], outs
    for out in outs:
        before_slow = out.partition('SLOW START')[0]
        assert f'BUILT {sum(PER_SHARD)} {root}/.vit_plugin_index/' in before_slow
        assert 'Indexing' not in before_slow and 'Waiting' not in before_slow


def test_the_waiting_process_outlasts_a_build_longer_than_the_groups_timeout(job):
    codes, outs = job
    assert codes == [0, 0], outs
    spans = [float(out.split('SLOW END ')[1].split()[0]) - float(out.split('SLOW START ')[1].split()[0])
             for out in outs]
    assert min(spans) > len(PER_SHARD) * SLOW_S - 1 > PG_TIMEOUT_S  # longer than a collective may wait
    builders = [out for out in outs if f'Indexing {len(PER_SHARD)} shards' in out]
    waiters = [out for out in outs if 'Waiting for another process to build the index' in out]
    assert len(builders) == 1 and len(waiters) == 1  # one process of the job built it, the other waited
    assert all(f'[{sum(PER_SHARD)}, {sum(PER_SHARD)}]' in out for out in outs)
