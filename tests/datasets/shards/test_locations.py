"""vit_plugin.datasets.shards.locations: local paths, URLs, hf:// and the Hugging Face cache."""
import os.path as osp

import pytest

from vit_plugin.datasets.shards.locations import (hf_cached_path, hf_cached_snapshot, is_compressed_tar, is_remote,
                                                  join_url, local_path, resolve_hf_url)


def test_is_remote_tells_fsspec_urls_from_local_paths():
    assert [is_remote(u) for u in ('s3://b/k.tar', 'gs://b/k', 'https://h/x.tar', 'hf://datasets/o/n/x.tar',
                                   'simplecache::s3://b/k')] == [True] * 5
    assert [is_remote(u) for u in ('/data/x.tar', 'rel/x.tar', 'file:///data/x.tar', 'C:\\data\\x.tar')] == [False] * 4
    assert local_path('file:///data/x.tar') == '/data/x.tar' and local_path('rel/x.tar') == 'rel/x.tar'


def test_join_url_joins_local_folders_and_urls():
    assert join_url('/data/wds', 'train/s0.tar') == osp.join('/data/wds', 'train', 's0.tar')
    assert join_url('hf://datasets/timm/imagenet-1k-wds/', 'x.tar') == 'hf://datasets/timm/imagenet-1k-wds/x.tar'
    assert join_url('s3://bucket/wds', 'x.tar') == 's3://bucket/wds/x.tar'
    assert join_url('s3://bucket/wds', 'https://mirror/x.tar') == 'https://mirror/x.tar'


def test_compressed_tars_are_told_by_their_suffix():
    assert [is_compressed_tar(n) for n in ('a.tar.gz', 'b.TGZ', 'c.tar.zst', 'd.tar', 'e.gz')] == [
        True, True, True, False, False]


def test_hf_urls_resolve_to_repository_revision_and_path():
    assert resolve_hf_url('hf://datasets/timm/imagenet-22k-wds/train/x-0000.tar') == (
        'dataset', 'timm/imagenet-22k-wds', 'main', 'train/x-0000.tar')
    assert resolve_hf_url('hf://datasets/timm/imagenet-1k-wds@v1.0/x.tar') == (
        'dataset', 'timm/imagenet-1k-wds', 'v1.0', 'x.tar')
    assert resolve_hf_url('hf://datasets/org/name@refs%2Fpr%2F3') == ('dataset', 'org/name', 'refs/pr/3', '')
    assert resolve_hf_url('hf://datasets/org/name@refs/pr/3/a/b.tar') == ('dataset', 'org/name', 'refs/pr/3',
                                                                          'a/b.tar')
    assert resolve_hf_url('hf://google/vit-base-patch16-224/model.safetensors') == (
        'model', 'google/vit-base-patch16-224', 'main', 'model.safetensors')
    with pytest.raises(ValueError, match='hf://datasets/<org>/<name>'):
        resolve_hf_url('hf://datasets/lonely')


def test_hf_urls_find_their_files_in_the_cache(hf_cache, tmp_path):
    snapshot = str(tmp_path / 'hub' / 'datasets--org--toy-wds' / 'snapshots' / ('c' * 40))
    assert hf_cached_snapshot(resolve_hf_url('hf://datasets/org/toy-wds')) == snapshot
    assert hf_cached_snapshot(resolve_hf_url('hf://datasets/org/toy-wds@v2')) is None  # no such ref cached
    assert hf_cached_path(resolve_hf_url('hf://datasets/org/toy-wds/train/s0.tar')) == osp.join(
        snapshot, 'train', 's0.tar')
    assert hf_cached_path(resolve_hf_url('hf://datasets/org/toy-wds/train/s1.tar')) is None
