"""``tools/train.py --compile``: mmengine's ``compile`` option (the runner compiles ``train_step`` with
Inductor) trains, and a compiled run resumed from its checkpoint repeats the uninterrupted compiled
run's losses."""
import shutil

import numpy as np
import pytest

from helpers.common import read_losses
from helpers.training_runs import iter_config, run, train_cmd


@pytest.mark.slow
def test_compiled_training_resumes_with_the_same_losses(tmp_path, digits_root):
    cfg = iter_config(tmp_path / 'cfg.py', digits_root)  # a 2-block ViT with dropout, no augmentation
    options = ['--cfg-options', 'train_cfg.max_iters=6', 'default_hooks.checkpoint.interval=3']
    full = tmp_path / 'full'
    proc = run(train_cmd(cfg, full, '--compile', *options))
    assert 'Model has been "compiled"' in proc.stdout + proc.stderr
    losses = read_losses(full)
    assert sorted(losses) == list(range(6)) and all(np.isfinite(list(losses.values())))

    resumed = tmp_path / 'resumed'  # a new work dir that continues from the full run's iteration 3
    resumed.mkdir()
    shutil.copy(full / 'iter_3.pth', resumed / 'iter_3.pth')
    run(train_cmd(cfg, resumed, '--compile', '--resume', str(resumed / 'iter_3.pth'), *options))
    after = read_losses(resumed)
    assert sorted(after) == [3, 4, 5]
    np.testing.assert_allclose([after[i] for i in (3, 4, 5)], [losses[i] for i in (3, 4, 5)], rtol=0, atol=1e-5)
