"""The MPP study's pieces: the class-balanced label subsets and the one-command script at a toy budget."""
import json
import os
import os.path as osp
import subprocess
import sys

import numpy as np
import pytest
from helpers.common import REPO, run_env

PROJECT = osp.join(REPO, 'projects', 'masked_patch_prediction')


def _digits_cfg(root):
    return dict(type='vit_plugin.DigitsDataset', data_root=root, split='train', pipeline=[])


def test_label_subset_is_class_balanced_nested_and_seeded(digits_root):
    from mmengine.registry import DATASETS, init_default_scope

    import vit_plugin  # noqa: F401
    init_default_scope('mmpretrain')
    full = DATASETS.build(_digits_cfg(digits_root))
    labels = np.asarray(full.get_gt_labels())

    def subset(n, seed):
        return DATASETS.build(dict(type='vit_plugin.LabelSubsetDataset', dataset=_digits_cfg(digits_root),
                                   num_per_class=n, seed=seed))

    previous = set()
    for n in (1, 5, 10, 25):
        ds = subset(n, seed=3)
        assert len(ds) == 10 * n
        assert np.bincount(ds.get_gt_labels(), minlength=10).tolist() == [n] * 10
        paths = {ds.get_data_info(i)['img_path'] for i in range(len(ds))}
        assert previous <= paths, f'{n} per class does not contain the smaller subset'  # nested
        previous = paths
        # every sample is what the wrapped dataset holds at that index, with its own label
        for i in (0, len(ds) - 1):
            info = ds.get_data_info(i)
            assert labels[ds.indices[i]] == info['gt_label'] == ds.get_cat_ids(i)[0]
    same, other = subset(5, seed=3), subset(5, seed=4)
    assert same.indices.tolist() == subset(5, seed=3).indices.tolist()
    assert same.indices.tolist() != other.indices.tolist()
    everything = subset(None, seed=0)
    assert len(everything) == len(full) and everything.get_gt_labels().tolist() == labels.tolist()
    assert everything.metainfo['classes'] == full.metainfo['classes']


def test_label_subset_errors_name_the_problem(digits_root):
    from mmengine.registry import init_default_scope

    from vit_plugin.datasets import LabelSubsetDataset
    init_default_scope('mmpretrain')
    with pytest.raises(ValueError, match='positive integer or None'):
        LabelSubsetDataset(_digits_cfg(digits_root), num_per_class=0)
    with pytest.raises(ValueError, match='class 0: 1'):  # the train split holds ~143 images per class
        LabelSubsetDataset(_digits_cfg(digits_root), num_per_class=500)


def test_label_subset_feeds_a_runner_dataloader(digits_root, tmp_path):
    """In a config, the wrapper sits where any dataset sits; an infinite sampler repeats the subset."""
    from mmengine.registry import init_default_scope
    from mmengine.runner import Runner

    import vit_plugin  # noqa: F401
    init_default_scope('mmpretrain')
    loader = Runner.build_dataloader(dict(
        batch_size=8, num_workers=0, sampler=dict(type='InfiniteSampler', shuffle=True, seed=0),
        collate_fn=dict(type='default_collate'),
        dataset=dict(type='vit_plugin.LabelSubsetDataset', num_per_class=1, seed=0, dataset=dict(
            type='vit_plugin.DigitsDataset', data_root=digits_root, split='train',
            pipeline=[dict(type='LoadImageFromFile'), dict(type='PackInputs')]))))
    batches = iter(loader)
    seen = [int(s.gt_label) for _ in range(5) for s in next(batches)['data_samples']]
    assert len(seen) == 40 and sorted(set(seen)) == list(range(10))


@pytest.mark.slow
def test_study_script_runs_end_to_end_at_toy_budget(tmp_path, digits_root):
    work = tmp_path / 'study'
    proc = subprocess.run([sys.executable, osp.join(PROJECT, 'run_experiment.py'), '--budget', 'toy',
                           '--work-dir', str(work), '--data-root', digits_root],
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
    assert eff['mpp']['1']['train_images'] == 10 and eff['scratch']['all']['train_images'] > 1000
    assert all(0 <= v['mean'] <= 100 for arm in eff.values() for v in arm.values())
    assert list(results['ablations']['variants']) == ['mean colour, 50%', '4x4 colours, 50%', 'pixels L2, 50%',
                                                      'mean colour, 15%']
    assert 'Test top-1 (%), fine-tuned' in proc.stdout
