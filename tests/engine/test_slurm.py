"""``tools/slurm_train.sh``: the srun invocation (mmpretrain's interface), recorded by a stand-in ``srun``
(tests/helpers/srun_stub.py), and a two-task run on the CPU of the command it hands srun (tools/train.py's
code, vit_plugin.cli.train), each task with SLURM's variables (forked ranks,
helpers/warm_runs.py)."""
import json
import os
import os.path as osp
import sys

import pytest

from helpers.common import HELPERS, REPO, free_port, read_losses, run_env
from helpers.srun_stub import ntasks, task_env
from helpers.training_runs import iter_config, run
from helpers.warm_runs import run_forks, warm_config
from vit_plugin.cli.train import main as train_main
from vit_plugin.engine.slurm import first_host, slurm_env


@pytest.mark.parametrize('nodelist,host', [('node7', 'node7'), ('gpu[03-05,07],cpu1', 'gpu03'),
                                           ('a-1,a-2', 'a-1'), ('dgx[1,4]', 'dgx1')])
def test_first_host_of_a_node_list(nodelist, host):
    assert first_host(nodelist) == host


def test_slurm_env_maps_the_task_variables(monkeypatch):
    monkeypatch.setenv('PATH', '/nonexistent')  # no scontrol: the node list is read directly
    env = dict(SLURM_PROCID='3', SLURM_NTASKS='8', SLURM_LOCALID='1', SLURM_NODELIST='gpu[12-13]')
    assert slurm_env(env) == dict(RANK='3', WORLD_SIZE='8', LOCAL_RANK='1', MASTER_ADDR='gpu12', MASTER_PORT='29500')
    assert slurm_env(dict(env, MASTER_ADDR='10.0.0.1', MASTER_PORT='1234'))['MASTER_ADDR'] == '10.0.0.1'
    with pytest.raises(KeyError, match='SLURM_PROCID.*start the tasks with srun'):
        slurm_env(dict(SLURM_NTASKS='2', SLURM_NODELIST='x'))


@pytest.mark.slow
def test_slurm_train_sh_trains_two_tasks(tmp_path, digits_root):
    bin_dir = tmp_path / 'bin'
    bin_dir.mkdir()
    with open(osp.join(HELPERS, 'srun_stub.py')) as f:
        (bin_dir / 'srun').write_text(f'#!{sys.executable}\n' + f.read())
    (bin_dir / 'srun').chmod(0o755)
    log = tmp_path / 'srun.json'
    env = dict(run_env(), PATH=f'{bin_dir}{os.pathsep}{os.environ["PATH"]}', SRUN_STUB_LOG=str(log),
               MASTER_PORT=str(free_port()), GPUS='2', CPUS_PER_TASK='1')
    cfg = warm_config(iter_config(tmp_path / 'cfg.py', digits_root, batch_size=16), 'warm')
    work = tmp_path / 'work'
    run(['bash', osp.join(REPO, 'tools', 'slurm_train.sh'), 'debug', 'vit-test', cfg, str(work),
         '--cfg-options', 'train_cfg.max_iters=6'], env=env)

    srun = json.loads(log.read_text())
    assert srun['options'] == {'-p': 'debug', '--job-name': 'vit-test', '--gres': 'gpu:2', '--ntasks': '2',
                               '--ntasks-per-node': '2', '--cpus-per-task': '1', '--kill-on-bad-exit': '1',
                               '--signal': 'USR1@120'}
    assert srun['command'][1:5] == ['-u', osp.join(REPO, 'tools', 'train.py'), cfg, f'--work-dir={work}']
    assert srun['command'][0] == sys.executable and '--launcher=slurm' in srun['command']
    # the job step: tools/train.py's code on the command's arguments once per task, with SLURM's variables
    envs = [dict(srun['env'], **task_env(srun['options'], rank)) for rank in range(ntasks(srun['options']))]
    tasks = run_forks(train_main, srun['command'][3:], envs, [tmp_path / f'task{rank}.out' for rank in (0, 1)])
    assert tasks.code == 0, tasks.output[-4000:]
    losses = [read_losses(work, rank) for rank in (0, 1)]
    assert sorted(losses[0]) == sorted(losses[1]) == list(range(6))
    assert losses[0] != losses[1]  # two processes, each on its own half of the batch
    assert (work / 'iter_6.pth').is_file()
