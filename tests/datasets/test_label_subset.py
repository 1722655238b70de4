"""``vit_plugin.LabelSubsetDataset``: class-balanced, nested, seeded subsets in a runner's data loader."""
import numpy as np
import pytest


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
