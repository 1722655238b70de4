"""The process-group variables of a task ``srun`` started, for hosts where mmengine's SLURM set-up needs CUDA."""
import os
import re
import shutil
import subprocess
from typing import Dict, Mapping, Optional


def first_host(nodelist: str) -> str:
    """The first host of a SLURM node list: ``'gpu[03-05,07],cpu1'`` -> ``'gpu03'``."""
    match = re.match(r'([^,\[]+)(?:\[([^\]]+)\])?', nodelist.strip())
    if not match:
        raise ValueError(f'cannot read the SLURM node list {nodelist!r}')
    prefix, ranges = match.groups()
    if not ranges:
        return prefix
    return prefix + ranges.split(',')[0].split('-')[0]  # keeps the zero padding: [03-05] -> 03


def _master_address(nodelist: str) -> str:
    if shutil.which('scontrol'):  # SLURM's own expansion of the list
        out = subprocess.run(['scontrol', 'show', 'hostnames', nodelist], capture_output=True, text=True)
        hosts = out.stdout.split()
        if out.returncode == 0 and hosts:
            return hosts[0]
    return first_host(nodelist)


def slurm_env(environ: Optional[Mapping[str, str]] = None) -> Dict[str, str]:
    """``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT`` of this task.

    Address and port from the environment win; else the first host of ``SLURM_NODELIST`` and 29500.

    Raises:
        KeyError: Not inside an ``srun`` task.
    """
    env = os.environ if environ is None else environ
    missing = [k for k in ('SLURM_PROCID', 'SLURM_NTASKS', 'SLURM_NODELIST') if k not in env]
    if missing:
        raise KeyError(f'--launcher slurm: {", ".join(missing)} not set; start the tasks with srun '
                       f'(tools/slurm_train.sh) or use --launcher pytorch with torchrun.')
    rank = int(env['SLURM_PROCID'])
    local = env.get('SLURM_LOCALID')
    return dict(RANK=str(rank), WORLD_SIZE=env['SLURM_NTASKS'],
                LOCAL_RANK=str(int(local) if local is not None else 0),
                MASTER_ADDR=env.get('MASTER_ADDR') or _master_address(env['SLURM_NODELIST']),
                MASTER_PORT=env.get('MASTER_PORT') or '29500')


__all__ = ['first_host', 'slurm_env']
