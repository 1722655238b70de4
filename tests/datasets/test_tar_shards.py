"""The shards a dataset reads: brace patterns, a list, the folder, the split file."""
import os
import os.path as osp

import pytest

from helpers.tar_shards import make_samples, write_wds
from vit_plugin.datasets.tar_shards import expand_braces, resolve_shards
from vit_plugin.datasets.tar_scan import TarIndexError

PER_SHARD = (7, 5, 9)


@pytest.fixture
def wds(tmp_path):
    folder = str(tmp_path / 'wds')
    write_wds(folder, make_samples(sum(PER_SHARD), seed=1), PER_SHARD)
    return folder


def test_brace_patterns_expand_as_braceexpand_does():
    braceexpand = pytest.importorskip('braceexpand').braceexpand  # webdataset's own dependency
    for pattern in ('a-{0000..0011}.tar', 'x{1..3}-{a,b}.tar', 'train-{7..10}.tar', 'plain.tar', '{09..11}'):
        assert expand_braces(pattern) == list(braceexpand(pattern))


def test_shards_by_pattern_list_folder_and_split_file(wds):
    names = ('imagenet22k-train-0000.tar', 'imagenet22k-train-0001.tar', 'imagenet22k-train-0002.tar')
    assert resolve_shards(wds, 'imagenet22k-train-{0000..0002}.tar', 'train').names == names
    assert resolve_shards(wds, list(names[:2]), None).names == names[:2]
    from_info = resolve_shards(wds, None, 'train')
    assert from_info.names == names and from_info.counts == PER_SHARD
    os.remove(osp.join(wds, '_info.json'))
    listed = resolve_shards(wds, None, 'train')
    assert listed.names == names and listed.counts is None
    with pytest.raises(TarIndexError, match="no .tar shard with '-validation-'"):
        resolve_shards(wds, None, 'validation')
