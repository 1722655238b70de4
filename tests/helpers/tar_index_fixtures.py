"""The toy shards the tar-index test files share: three WebDataset shards of 7, 5 and 9 samples (the
``samples`` and ``wds`` fixtures, imported by those files), opened and read back as the index does."""
import pytest

from helpers.tar_shards import make_samples, write_wds
from vit_plugin.datasets.tar_index import TarShardIndex
from vit_plugin.datasets.tar_scan import LabelRule
from vit_plugin.datasets.tar_shards import resolve_shards

PER_SHARD = (7, 5, 9)


@pytest.fixture(scope='module')
def samples():
    return make_samples(sum(PER_SHARD), seed=1)


@pytest.fixture
def wds(tmp_path, samples):
    folder = str(tmp_path / 'wds')
    write_wds(folder, samples, PER_SHARD)
    return folder


def open_index(folder, rule=LabelRule(), split='train', shards=None, **kwargs):
    return TarShardIndex.open(resolve_shards(folder, shards, split), rule=rule, split=split, workers=1, **kwargs)


def read_image(index, row):
    with open(index.shard_url(index.shard_of(row)), 'rb') as f:
        f.seek(int(index.offsets[row]))
        return f.read(int(index.sizes[row]))
