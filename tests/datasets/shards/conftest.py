"""Fixtures of the vit_plugin.datasets.shards tests: a folder of toy shards, a loopback HTTP server on it
that counts requests and injects faults, and a Hugging Face cache in a temporary folder (offline)."""
import hashlib

import pytest

from helpers.toy_shards import make_hf_cache, make_shard_folder
from benchmarks.loopback_http import serve_folder


@pytest.fixture(scope='module')
def shards(tmp_path_factory):
    return make_shard_folder(tmp_path_factory.mktemp('shards'))


@pytest.fixture(scope='module')
def server(shards):
    with serve_folder(shards['root']) as srv:
        yield srv


@pytest.fixture
def srv(server):
    server.reset_counts()
    return server


@pytest.fixture
def loopback():
    """``serve_folder(folder, delay_s=0.0, ranges=True)``: a loopback server of its own, as a context."""
    return serve_folder


@pytest.fixture
def hf_cache(shards, tmp_path, monkeypatch):
    """The cache of :func:`helpers.toy_shards.make_hf_cache` as ``HF_HUB_CACHE``, with HF_HUB_OFFLINE=1;
    ``dict(sha, blob_id)`` of its two files."""
    sha = hashlib.sha256(shards['data']['s0.tar']).hexdigest()
    blob_id = make_hf_cache(tmp_path / 'hub', shards['data']['s0.tar'], sha)
    monkeypatch.setenv('HF_HUB_CACHE', str(tmp_path / 'hub'))
    monkeypatch.setenv('HF_HUB_OFFLINE', '1')
    return dict(sha=sha, blob_id=blob_id)
