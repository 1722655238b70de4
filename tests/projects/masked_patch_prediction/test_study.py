"""The MPP study's one-command script (projects/masked_patch_prediction/run_experiment.py) at a toy budget,
on a digits dataset of 16 training and 5 test images per class."""
import json
import os
import os.path as osp
import subprocess
import sys

import numpy as np
import pytest
from helpers.common import REPO, run_env
from helpers.mpp_study_data import digits_subset


PROJECT = osp.join(REPO, 'projects', 'masked_patch_prediction')


@pytest.mark.slow
def test_study_script_runs_end_to_end_at_toy_budget(tmp_path, digits_root):
    work = tmp_path / 'study'
    data = digits_subset(digits_root, str(tmp_path / 'digits'), train_per_class=16, test_per_class=5)
    proc = subprocess.run([sys.executable, osp.join(PROJECT, 'run_experiment.py'), '--budget', 'toy',
                           '--work-dir', str(work), '--data-root', data],
                          env=run_env(), cwd=str(tmp_path), capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for name in ('results.json', 'label_efficiency.png', 'pretraining.png', 'predictions.png'):
        assert os.path.getsize(work / name) > 1000, name
    with open(work / 'results.json') as f:
        text = f.read()
    results = json.loads(text)
    assert REPO not in text  # nothing of this machine's layout in a shared results file
    pre = results['pretraining']
    assert len(pre['runs'][0]['loss']) == 4 and 0 < pre['marginal_entropy'] < np.log(512)
    assert set(pre['runs'][0]['context']) == {'neighbours_visible', 'all_masked'}
    eff = results['label_efficiency']['top1']
    assert set(eff) == {'mpp', 'scratch'} and list(eff['mpp']) == ['1', 'all']
    # 1 labelled image per class, and all labels: the whole training split (the data: 16 per class)
    assert eff['mpp']['1']['train_images'] == 10 and eff['scratch']['all']['train_images'] == 160
    assert all(0 <= v['mean'] <= 100 for arm in eff.values() for v in arm.values())
    assert list(results['ablations']['variants']) == ['mean colour, 50%', '4x4 colours, 50%', 'pixels L2, 50%',
                                                      'mean colour, 15%']
    assert 'Test top-1 (%), fine-tuned' in proc.stdout
