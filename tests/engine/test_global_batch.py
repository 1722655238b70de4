"""``global_batch_size``: a global batch becomes gradient accumulation, with the step counts rescaled."""
import os.path as osp

import pytest

from helpers.common import REPO


pytestmark = pytest.mark.slow


def test_global_batch_becomes_accumulation_and_rescaled_counts():
    from mmengine.config import Config

    from vit_plugin.engine.global_batch import apply_global_batch_size
    cfg = Config.fromfile(osp.join(REPO, 'configs', 'vit_l16_in21k_ft_in1k_384.py'))
    cfg.train_dataloader.batch_size = 16
    assert apply_global_batch_size(cfg, world_size=8) == 4  # 512 = 16 x 8 x 4
    assert cfg.optim_wrapper.accumulative_counts == 4
    assert cfg.train_cfg.max_iters == 80000 and cfg.train_cfg.val_interval == 80000
    warmup, cosine = cfg.param_scheduler
    assert (warmup.begin, warmup.end, cosine.begin, cosine.end) == (0, 2000, 2000, 80000)
    assert cfg.default_hooks.checkpoint.interval == 80000 and cfg.default_hooks.logger.interval == 200
    assert cfg.custom_hooks[0].interval == 4  # the EMA moves once per optimizer step

    cfg = Config.fromfile(osp.join(REPO, 'configs', 'vit_l16_in21k.py'))
    with pytest.raises(ValueError, match='not a multiple of batch_size=32 x 3 processes'):
        apply_global_batch_size(cfg, world_size=3)
    cfg.global_batch_size = None
    assert apply_global_batch_size(cfg, world_size=3) == 1 and cfg.train_cfg.max_iters == 312000
