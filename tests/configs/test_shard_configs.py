"""The tar-shard dataset configs: each builds its datasets from data in its format (timm's WebDataset
shards with their _info.json, image-net.org's tar of tars) and serves samples through its own pipeline."""
import os.path as osp

import pytest
from mmengine.config import Config
from mmengine.registry import DATASETS, init_default_scope
from timm.data import ImageNetInfo

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


def check_samples(dataset, size, labels):
    """Every sample, read through the config's pipeline, is an image of ``size`` with the label ``labels``
    gives for its key (the file name in the shard)."""
    read = {}
    for i in range(len(dataset)):
        sample = dataset[i]
        assert tuple(sample['inputs'].shape) == (3, size, size)
        member = sample['data_samples'].img_path.rsplit(':', 1)[1]  # <shard>:<member path>
        key = osp.splitext(osp.basename(member))[0]
        read[key] = int(sample['data_samples'].gt_label)
    assert read == labels


def imagenet1k_synsets():
    """The 1,000 synsets in their label order, from timm's copy of the list (not the package's)."""
    return ImageNetInfo('imagenet-1k').label_names()


@pytest.mark.parametrize('name, prefix, classes', [('imagenet21k_wds.py', 'imagenet22k', 21841),
                                                   ('imagenet21k_w21_wds.py', 'imagenet-w21', 19167)])
def test_pretraining_shard_configs_read_timm_shards(tmp_path, name, prefix, classes):
    cfg = Config.fromfile(osp.join(BASE, name))
    assert cfg.num_classes == classes == cfg.data_preprocessor.num_classes
    assert cfg.train_dataloader.sampler.type == 'vit_plugin.BlockShuffleSampler'
    samples = make_samples(12, seed=4, size=40)
    write_wds(str(tmp_path), samples, (5, 7), prefix=prefix)
    dataset = build(cfg, 'train_dataloader', str(tmp_path))
    assert len(dataset) == 12 and dataset.shard_root == str(tmp_path)
    check_samples(dataset, 224, {s.key: s.label for s in samples})  # the label each shard's .cls holds


def test_imagenet1k_shard_config_reads_train_and_validation_shards(tmp_path):
    cfg = Config.fromfile(osp.join(BASE, 'imagenet1k_wds_384.py'))
    reference = imagenet1k_synsets()
    synsets = [reference[7], reference[2], reference[640], reference[999], reference[0]]
    # each shard's .cls holds the imagenet1k label, as in timm's imagenet-1k shards
    labelled = lambda samples: [s._replace(label=reference.index(s.synset)) for s in samples]  # noqa: E731
    train_samples = labelled(make_samples(9, seed=5, size=40, synsets=synsets))
    val_samples = labelled(make_samples(6, seed=6, size=40, synsets=synsets))
    write_wds(str(tmp_path), train_samples, (4, 5), prefix='imagenet1k')
    write_wds(str(tmp_path), val_samples, (6,), prefix='imagenet1k', split='validation')
    train, val = build(cfg, 'train_dataloader', str(tmp_path)), build(cfg, 'val_dataloader', str(tmp_path))
    assert (len(train), len(val)) == (9, 6)
    assert train.metainfo['classes'][:5] == label_spaces.class_names('imagenet1k')[:5]
    check_samples(train, 384, {s.key: reference.index(s.synset) for s in train_samples})
    check_samples(val, 384, {s.key: reference.index(s.synset) for s in val_samples})
    assert cfg.test_dataloader.dataset.split == 'validation'


def test_ilsvrc_tar_config_reads_the_tar_of_tars(tmp_path):
    cfg = Config.fromfile(osp.join(BASE, 'imagenet1k_tar_384.py'))
    reference = imagenet1k_synsets()
    chosen = [reference[3], reference[500], reference[999]]
    samples = make_samples(10, seed=7, size=40, synsets=chosen)
    write_tar_of_tars(str(tmp_path / 'ILSVRC2012_img_train.tar'), samples)
    dataset = build(cfg, 'train_dataloader', str(tmp_path))
    # the label of a sample is its synset tar's place in the synset list
    check_samples(dataset, 384, {s.key: reference.index(s.synset) for s in samples})
    assert cfg.val_dataloader.dataset.type == 'vit_plugin.ImageNet'  # validation stays the folder
