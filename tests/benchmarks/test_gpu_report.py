"""``make gpu-report`` (tools/analysis/gpu_report.py): its CPU smoke subset runs here and writes both
report files with every section; on a host without CUDA the report says so."""
import json
import os.path as osp

import torch

from helpers.common import REPO
from benchmarks import gpu_report


def test_smoke_subset_writes_the_report(tmp_path):
    out = tmp_path / 'gpu_report'
    threads = torch.get_num_threads()
    try:
        report = gpu_report.main(['--smoke', '--out-dir', str(out), '--tests', osp.join(REPO, 'tests', 'package', 'test_cuda.py')])
    finally:
        torch.set_num_threads(threads)
    saved = json.loads((out / 'report.json').read_text())
    assert saved['cuda'] is False and saved == json.loads(json.dumps(report, default=str))
    sections = saved['sections']
    assert list(sections) == ['environment', 'tests', 'benchmark_eager', 'memory', 'detection', 'pipeline',
                              'benchmark_compiled']
    assert all(s['status'] == 'ok' for s in sections.values()), {k: s['status'] for k, s in sections.items()}

    env = sections['environment']['result']
    assert env['torch'] == torch.__version__ and env['mmcv_ops']['description']
    tests = sections['tests']['result']
    assert tests['counts']['failed'] == tests['counts']['error'] == 0 and tests['cases']
    if not torch.cuda.is_available():
        assert all(c['outcome'] == 'skipped' and 'needs a CUDA GPU' in c['reason'] for c in tests['cases'])

    rows = {(r['model'], r['mode']) for r in sections['benchmark_eager']['result']['rows'] if 'note' not in r}
    assert rows == {(m, mode) for m in ('ours', 'timm', 'mmpretrain') for mode in ('infer', 'train')} | \
        {('ours+wrapper', 'train'), ('ours+guard', 'train')}
    memory, = sections['memory']['result']['rows']
    assert memory['measured_mib'] > 0 and memory['planned_mib'] > 0
    detection = sections['detection']['result']
    assert detection['finite'] and detection['train_s'] > 0 and detection['infer_s'] > 0
    pipeline = sections['pipeline']['result']
    assert pipeline['images_per_s'] > 0 and pipeline['workers_needed'] > 0

    text = (out / 'report.md').read_text()
    if not torch.cuda.is_available():
        assert text.startswith('# vit_plugin GPU report\n\n**No CUDA device on this host**')
    for title in ('## Environment', '## `cuda` tests', '## Benchmark, eager', '## Memory', '## Mask R-CNN ViT step',
                  '## Input pipeline against the GPU', '## Benchmark, compiled'):
        assert title in text
    assert "mmcv's operators:" in text and '| ti | train fp32 | 2 | ours+guard |' in text
