"""The dataset classes' checks: missing files and a partial dataset are named with their path."""
import pytest

pytestmark = pytest.mark.slow


@pytest.mark.parametrize('type_,kwargs,needle', [
    ('ImageNet21k', dict(ann_file='meta/train.txt', data_prefix='train'), 'meta/train.txt'),
    ('ImageNet', dict(split='val'), 'meta/{train,val}.txt'),
    ('OxfordIIITPet', dict(split='test'), 'annotations/{trainval,test}.txt'),
    ('Flowers102', dict(split='test'), 'setid.mat'),
    ('CIFAR10', dict(split='test', download=False), 'cifar-10-batches-py'),
])
def test_missing_dataset_files_name_the_path(tmp_path, type_, kwargs, needle):
    from mmengine.registry import DATASETS

    from vit_plugin.datasets import DataRootNotFoundError
    missing = tmp_path / 'nowhere'
    with pytest.raises(DataRootNotFoundError) as err:
        DATASETS.build(dict(type=f'vit_plugin.{type_}', data_root=str(missing), **kwargs))
    message = str(err.value)
    assert str(missing) in message and needle in message and "'Data preparation'" in message


def test_partial_dataset_names_the_missing_file(tmp_path):
    from vit_plugin.datasets import DataRootNotFoundError
    from vit_plugin.datasets.checked import ImageNet21k
    (tmp_path / 'train').mkdir()
    with pytest.raises(DataRootNotFoundError, match=str(tmp_path / 'meta' / 'train.txt')):
        ImageNet21k(data_root=str(tmp_path), ann_file='meta/train.txt', data_prefix='train')
