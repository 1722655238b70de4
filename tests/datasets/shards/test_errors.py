"""vit_plugin.datasets.shards.errors: a shard error keeps its URL and reason across processes."""
import pickle

from vit_plugin.datasets.shards.errors import ShardNotFoundError


def test_shard_read_error_survives_pickling():
    err = pickle.loads(pickle.dumps(ShardNotFoundError('s3://b/x.tar', 'not found.')))
    assert (type(err), err.url, err.reason, str(err)) == (ShardNotFoundError, 's3://b/x.tar', 'not found.',
                                                          's3://b/x.tar: not found.')
    assert isinstance(err, FileNotFoundError)
