"""``vit_plugin.cli.launch``: a rank that finished exits with the run's status."""
import subprocess
import sys

import pytest


pytestmark = pytest.mark.slow


@pytest.mark.parametrize('ending, status', [('return', 0), ('raise SystemExit(75)', 75), ("raise SystemExit('stop')", 1)])
def test_a_rank_that_finished_exits_with_the_runs_status(tmp_path, ending, status):
    """``run_as_script`` (tools/train.py, tools/test.py): a process that was part of a process group exits
    with the run's status and its output flushed, also on the path that skips the interpreter's teardown."""
    import subprocess
    import sys
    script = tmp_path / 'rank.py'
    script.write_text(f"""
import torch.distributed as dist
from vit_plugin.cli.launch import release_process_group, run_as_script
def main():
    dist.init_process_group('gloo', init_method='file://{tmp_path / "store"}', rank=0, world_size=1)
    print('trained', flush=False)
    release_process_group()
    {ending}
run_as_script(main)
""")
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == status, proc.stderr[-2000:]
    assert proc.stdout.strip().endswith('trained')
    assert ('stop' in proc.stderr) == (status == 1)
