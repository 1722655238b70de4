"""vit_plugin.datasets.shards.listing: folder listings, fingerprints and small files, over a loopback HTTP
server and from a Hugging Face cache offline."""
import os.path as osp

from vit_plugin.datasets.shards.listing import fingerprint, fingerprints_in_folder, list_folder, read_small_file


def test_local_fingerprint_changes_when_the_shard_is_rewritten(tmp_path):
    path = tmp_path / 'x.tar'
    path.write_bytes(b'a' * 100)
    before = fingerprint(str(path))
    path.write_bytes(b'b' * 101)
    assert set(before) == {'size', 'mtime_ns'} and fingerprint(str(path)) != before


def test_listing_a_local_folder_finds_the_shards_and_the_compressed_tars(shards):
    listing = list_folder(shards['root'])
    assert (listing.shards, listing.compressed) == (['s0.tar', 's1.tar'], ['old.tar.gz'])
    assert listing.fingerprints == {name: fingerprint(osp.join(shards['root'], name)) for name in listing.shards}


def test_listing_a_remote_folder_finds_the_shards_and_the_compressed_tars(srv):
    listing = list_folder(srv.url + '/')
    assert (listing.shards, listing.compressed, srv.requests) == (['s0.tar', 's1.tar'], ['old.tar.gz'], 1)


def test_remote_fingerprints_of_a_folder_equal_those_of_each_file(srv):
    found = fingerprints_in_folder(srv.url)
    assert found == {name: fingerprint(f'{srv.url}/{name}') for name in ('s0.tar', 's1.tar')}
    assert found['s0.tar']['ETag'] != found['s1.tar']['ETag']


def test_small_files_are_read_whole_or_none_when_missing(srv, shards):
    assert read_small_file(srv.url + '/_info.json') == b'{"name": "toy"}'
    assert read_small_file(srv.url + '/info.json') is None
    assert read_small_file(osp.join(shards['root'], 'info.json')) is None


def test_hf_offline_fingerprint_is_the_hubs_lfs_sha256(shards, hf_cache):
    assert fingerprint('hf://datasets/org/toy-wds/train/s0.tar') == {'size': len(shards['data']['s0.tar']),
                                                                     'sha256': hf_cache['sha']}


def test_hf_offline_listing_and_small_files_come_from_the_cache(hf_cache):
    assert list_folder('hf://datasets/org/toy-wds/train').shards == ['s0.tar']
    assert read_small_file('hf://datasets/org/toy-wds/_info.json') == b'{"split": "train"}'
    assert read_small_file('hf://datasets/org/toy-wds/info.json') is None
