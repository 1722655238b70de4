"""The tar-shard dataset configs: each builds its datasets from data in its format (timm's WebDataset
shards with their _info.json, image-net.org's tar of tars) and serves samples through its own pipeline."""
import os.path as osp

import pytest
from mmengine.config import Config
from mmengine.registry import DATASETS, init_default_scope

from helpers.common import REPO
from helpers.tar_shards import make_samples, write_tar_of_tars, write_wds
import vit_plugin  # noqa: F401  (registers the vit_plugin scope)
from vit_plugin import label_spaces

BASE = osp.join(REPO, 'configs', '_base_', 'datasets')


def build(cfg, key, root, **overrides):
    dataset = dict(cfg[key].dataset, data_root=root, index_workers=1, **overrides)
    return DATASETS.build(dataset)


@pytest.fixture(autouse=True)
def scope():
    init_default_scope('mmpretrain')


def check_sample(dataset, size):
    sample = dataset[0]
    assert tuple(sample['inputs'].shape) == (3, size, size)
    assert 0 <= int(sample['data_samples'].gt_label) < dataset.num_classes


@pytest.mark.parametrize('name, prefix, classes', [('imagenet21k_wds.py', 'imagenet22k', 21841),
                                                   ('imagenet21k_w21_wds.py', 'imagenet-w21', 19167)])
def test_pretraining_shard_configs_read_timm_shards(tmp_path, name, prefix, classes):
    cfg = Config.fromfile(osp.join(BASE, name))
    assert cfg.num_classes == classes == cfg.data_preprocessor.num_classes
    assert cfg.train_dataloader.sampler.type == 'vit_plugin.BlockShuffleSampler'
    write_wds(str(tmp_path), make_samples(12, seed=4, size=40), (5, 7), prefix=prefix)
    dataset = build(cfg, 'train_dataloader', str(tmp_path))
    assert len(dataset) == 12 and dataset.shard_root == str(tmp_path)
    check_sample(dataset, 224)


def test_imagenet1k_shard_config_reads_train_and_validation_shards(tmp_path):
    cfg = Config.fromfile(osp.join(BASE, 'imagenet1k_wds_384.py'))
    synsets = label_spaces.synsets('imagenet1k')[:5]
    write_wds(str(tmp_path), make_samples(9, seed=5, size=40, synsets=synsets), (4, 5), prefix='imagenet1k')
    write_wds(str(tmp_path), make_samples(6, seed=6, size=40, synsets=synsets), (6,), prefix='imagenet1k',
              split='validation')
    train, val = build(cfg, 'train_dataloader', str(tmp_path)), build(cfg, 'val_dataloader', str(tmp_path))
    assert (len(train), len(val)) == (9, 6)
    assert train.metainfo['classes'][:5] == label_spaces.class_names('imagenet1k')[:5]
    check_sample(train, 384)
    check_sample(val, 384)
    assert cfg.test_dataloader.dataset.split == 'validation'


def test_ilsvrc_tar_config_reads_the_tar_of_tars(tmp_path):
    cfg = Config.fromfile(osp.join(BASE, 'imagenet1k_tar_384.py'))
    synsets = label_spaces.synsets('imagenet1k')
    chosen = [synsets[3], synsets[500], synsets[999]]
    samples = make_samples(10, seed=7, size=40, synsets=chosen)
    write_tar_of_tars(str(tmp_path / 'ILSVRC2012_img_train.tar'), samples)
    dataset = build(cfg, 'train_dataloader', str(tmp_path))
    assert sorted(dataset.get_gt_labels().tolist()) == sorted(synsets.index(s.synset) for s in samples)
    check_sample(dataset, 384)
    assert cfg.val_dataloader.dataset.type == 'vit_plugin.ImageNet'  # validation stays the folder
