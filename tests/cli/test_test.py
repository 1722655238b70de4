"""tools/test.py (``vit_plugin.cli.test``): the top-1 it reports is the model's own on the test split."""
import json

import pytest
import torch
from mmengine.config import Config
from mmengine.registry import DefaultScope

from helpers.tiny_classifier import tiny_demo_checkpoint


def test_test_tool_reports_the_models_own_top1_on_the_test_split(tmp_path, digits_root):
    """tools/test.py (vit_plugin.cli.test): the top-1 it prints and writes with --out is the accuracy of
    the checkpoint's predictions on the config's test split, counted here image by image."""
    config, ckpt = tiny_demo_checkpoint(tmp_path, digits_root)
    from mmengine.dataset import pseudo_collate
    from mmpretrain.apis import get_model
    from mmpretrain.registry import DATASETS

    from vit_plugin.cli.test import main as test_main
    out = tmp_path / 'metrics.json'
    metrics = test_main([config, ckpt, '--work-dir', str(tmp_path / 'work'), '--out', str(out)])
    assert json.loads(out.read_text()) == {'accuracy/top1': pytest.approx(metrics['accuracy/top1'])}

    cfg = Config.fromfile(config)
    model = get_model(cfg, pretrained=ckpt, device='cpu').eval()
    with DefaultScope.overwrite_default_scope('mmpretrain'):
        dataset = DATASETS.build(cfg.test_dataloader.dataset)
    right = 0
    with torch.no_grad():
        for start in range(0, len(dataset), 64):
            batch = pseudo_collate([dataset[i] for i in range(start, min(start + 64, len(dataset)))])
            for sample in model.test_step(batch):
                right += int(sample.pred_label.item() == sample.gt_label.item())
    assert len(dataset) == 359 and 0 < right < len(dataset)
    assert metrics['accuracy/top1'] == pytest.approx(100 * right / len(dataset), abs=1e-4)

    with pytest.raises(SystemExit):  # evaluation has no XLA path: the launcher is refused up front
        test_main([config, ckpt, '--launcher', 'xla'])
