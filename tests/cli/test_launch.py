"""``vit_plugin.cli.launch``: a rank that finished exits with the run's status."""
import json
import subprocess
import sys

import pytest


pytestmark = pytest.mark.slow

ENDINGS = {'return': 0, 'raise SystemExit(75)': 75, "raise SystemExit('stop')": 1}

# One interpreter imports vit_plugin once and forks a process per ending; each process joins a process group
# of its own, prints without flushing and ends under ``run_as_script`` with its output going to files. The
# parent writes each process's exit status and output to ``results.json``.
SCRIPT = """
import json
import os
import sys

import torch.distributed as dist
from vit_plugin.cli.launch import release_process_group, run_as_script

root, results = sys.argv[1], {{}}
{cases}
for name, main in CASES.items():
    sys.stdout.flush()
    sys.stderr.flush()
    paths = [os.path.join(root, f'{{name}}.{{stream}}') for stream in ('out', 'err')]
    pid = os.fork()
    if pid == 0:
        for fd, path in zip((1, 2), paths):
            os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
        run_as_script(main)
        os._exit(99)  # run_as_script did not exit
    _, status = os.waitpid(pid, 0)
    output = []
    for path in paths:
        with open(path) as f:
            output.append(f.read())
    results[name] = [os.waitstatus_to_exitcode(status), *output]
with open(os.path.join(root, 'results.json'), 'w') as f:
    json.dump(results, f)
"""

CASE = """
def main_{index}():
    dist.init_process_group('gloo', init_method='file://' + os.path.join(root, 'store_{index}'), rank=0,
                            world_size=1)
    print('trained', flush=False)
    release_process_group()
    {ending}
"""


@pytest.fixture(scope='module')
def finished_ranks(tmp_path_factory):
    """Ending -> (exit status, stdout, stderr) of a process that ran ``run_as_script(main)``."""
    root = tmp_path_factory.mktemp('ranks')
    cases = ''.join(CASE.format(index=i, ending=ending) for i, ending in enumerate(ENDINGS))
    cases += 'CASES = {%s}\n' % ', '.join(f'{ending!r}: main_{i}' for i, ending in enumerate(ENDINGS))
    script = root / 'ranks.py'
    script.write_text(SCRIPT.format(cases=cases))
    proc = subprocess.run([sys.executable, str(script), str(root)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {ending: tuple(result) for ending, result in json.loads((root / 'results.json').read_text()).items()}


@pytest.mark.parametrize('ending, status', ENDINGS.items())
def test_a_rank_that_finished_exits_with_the_runs_status(finished_ranks, ending, status):
    """``run_as_script`` (tools/train.py, tools/test.py): a process that was part of a process group exits
    with the run's status and its output flushed, also on the path that skips the interpreter's teardown."""
    code, out, err = finished_ranks[ending]
    assert code == status, err[-2000:]
    assert out.strip().endswith('trained')
    assert ('stop' in err) == (status == 1)
