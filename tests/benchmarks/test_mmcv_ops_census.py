"""tools/analysis/mmcv_ops_census.py on one detector (a run of the tool, not a measurement)."""
import json

import pytest

from benchmarks import mmcv_ops_census


@pytest.mark.slow
def test_census_of_the_cascade_detector_records_its_operators(tmp_path):
    out = tmp_path / 'census.json'
    mmcv_ops_census.main(['--only', 'cascade', '--out', str(out)])
    saved = json.loads(out.read_text())
    label, = saved['configs']
    assert label.startswith('cascade_mask_rcnn_vit_tiny') and saved['device'] == 'cpu'
    entries = saved['configs'][label]
    assert any(e.startswith('train: ') for e in entries) and any(e.startswith('inference: ') for e in entries)
    assert 'roi_align_forward (cpu)' in saved['reached'] and saved['ops']
