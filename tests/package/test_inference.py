"""vit_plugin.inference: the classification inferencer that ``tools/infer.py`` builds."""
import numpy as np
from mmengine.config import Config
from mmengine.registry import DefaultScope

from helpers.tiny_classifier import tiny_demo_checkpoint
from vit_plugin.inference import build_classification_inferencer


def test_the_inferencer_builds_its_pipeline_whatever_scope_is_current(tmp_path, digits_root):
    """A runner of an mmengine-scoped config earlier in the process (a notebook, an earlier test) leaves that
    scope current; the config's unprefixed transforms are still mmpretrain's."""
    cfg, ckpt = tiny_demo_checkpoint(tmp_path, digits_root)
    with DefaultScope.overwrite_default_scope('mmengine'):
        inferencer = build_classification_inferencer(Config.fromfile(cfg), ckpt)
        assert DefaultScope.get_current_instance().scope_name == 'mmengine'
    result = inferencer(np.zeros((32, 32, 3), np.uint8))[0]
    assert len(result['pred_scores']) == 10 and list(inferencer.classes) == [str(i) for i in range(10)]
