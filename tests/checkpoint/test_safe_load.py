"""Checkpoints load with weights_only=True on every mmengine path; pickled code never runs."""
import pickle

import pytest
import torch
import torch.nn as nn
from mmengine.runner.checkpoint import CheckpointLoader, _load_checkpoint, load_checkpoint

import vit_plugin  # noqa: F401  (installs the safe loaders)
from vit_plugin.checkpoint import TRUST_ENV, CheckpointError, UnsafeCheckpointError, safe_torch_load


class _Payload:
    """Unpickling this creates a file: proof that code from the checkpoint ran."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, 'w'))


def _malicious_checkpoint(tmp_path):
    marker = tmp_path / 'pwned'
    path = tmp_path / 'pretrained.pth'
    torch.save({'state_dict': {'w': torch.ones(2)}, 'extra': _Payload(str(marker))}, path)
    assert not marker.exists()
    return path, marker


def test_mmengine_local_scheme_is_ours():
    from vit_plugin.checkpoint import load_local_checkpoint
    assert CheckpointLoader._get_checkpoint_loader('/some/file.pth') is load_local_checkpoint


@pytest.mark.parametrize('entry', ['safe_torch_load', '_load_checkpoint', 'load_checkpoint'])
def test_malicious_pickle_is_refused_and_never_runs(tmp_path, entry):
    path, marker = _malicious_checkpoint(tmp_path)
    with pytest.raises(UnsafeCheckpointError) as err:
        if entry == 'safe_torch_load':
            safe_torch_load(str(path))
        elif entry == '_load_checkpoint':
            _load_checkpoint(str(path))
        else:
            load_checkpoint(nn.Linear(2, 2), str(path))
    assert not marker.exists(), 'code from the checkpoint was executed'
    message = str(err.value)
    assert str(path) in message and TRUST_ENV in message and 'open' in message


def test_malicious_pickle_refused_through_init_cfg_pretrained(tmp_path):
    from vit_plugin.models import ViT
    path, marker = _malicious_checkpoint(tmp_path)
    model = ViT(arch=dict(embed_dims=16, num_layers=1, num_heads=2, mlp_dims=32), img_size=16, patch_size=8,
                init_cfg=dict(type='Pretrained', checkpoint=str(path)))
    with pytest.raises(UnsafeCheckpointError):
        model.init_weights()
    assert not marker.exists()


def test_trusted_file_opt_in_is_per_file(tmp_path, monkeypatch):
    path, marker = _malicious_checkpoint(tmp_path)
    (tmp_path / 'other').mkdir()
    other, _ = _malicious_checkpoint(tmp_path / 'other')
    monkeypatch.setenv(TRUST_ENV, str(path))
    safe_torch_load(str(path))  # the user vouched for this file: full unpickling
    assert marker.exists()
    with pytest.raises(UnsafeCheckpointError):
        safe_torch_load(str(other))


def test_plain_weights_and_metadata_load(tmp_path):
    model = nn.Sequential(nn.Linear(3, 4), nn.LayerNorm(4))
    path = tmp_path / 'w.pth'
    torch.save({'state_dict': model.state_dict(), 'meta': {'epoch': 3, 'classes': ['a', 'b']}}, path)
    ckpt = _load_checkpoint(str(path))
    assert ckpt['meta']['classes'] == ['a', 'b']
    assert torch.equal(ckpt['state_dict']['0.weight'], model[0].weight)


def test_truncated_file_gives_clear_error(tmp_path):
    path = tmp_path / 'cut.pth'
    torch.save({'w': torch.randn(1000)}, path)
    data = path.read_bytes()
    path.write_bytes(data[:len(data) // 2])
    with pytest.raises(CheckpointError, match='truncated'):
        _load_checkpoint(str(path))


def test_missing_file_names_the_path(tmp_path):
    with pytest.raises(FileNotFoundError, match='nope.pth'):
        _load_checkpoint(str(tmp_path / 'nope.pth'))


def test_runner_checkpoint_with_history_buffers_resumes_on_torch_2_9(tmp_path):
    """mmengine 0.10.7 writes HistoryBuffer objects, numpy scalars and getattr() into runner
    checkpoints; plain torch.load(weights_only=True) refuses them on torch >= 2.6."""
    import numpy as np
    from mmengine.logging import HistoryBuffer, MessageHub
    hub = MessageHub.get_instance('safe_load_test')
    hub.update_scalar('train/loss', np.float64(0.5))
    hub.update_scalar('train/lr', 0.1)
    hub.update_info('iter', np.int64(7))
    path = tmp_path / 'iter_7.pth'
    torch.save({'meta': {'iter': 7, 'seed': np.int64(3)}, 'message_hub': hub.state_dict(),
                'state_dict': nn.Linear(2, 2).state_dict()}, path)
    with pytest.raises(pickle.UnpicklingError):
        torch.load(path, weights_only=True)  # the mmengine-0.10.7-on-torch-2.9 failure we fix
    ckpt = _load_checkpoint(str(path))
    buf = ckpt['message_hub']['log_scalars']['train/loss']
    assert isinstance(buf, HistoryBuffer) and buf.current() == 0.5 and buf.mean() == 0.5
    assert ckpt['meta']['seed'] == 3


def test_getattr_stand_in_refuses_other_attributes(tmp_path):
    from mmengine.logging import HistoryBuffer

    class Sneaky:
        # Looks like mmengine's own getattr(HistoryBuffer, 'mean') but reaches another attribute.
        def __reduce__(self):
            return (getattr, (HistoryBuffer, '__init__'))

    path = tmp_path / 'sneaky.pth'
    torch.save({'x': Sneaky()}, path)
    with pytest.raises(UnsafeCheckpointError, match='__init__'):
        safe_torch_load(str(path))


# ----------------------------------------------------------------------------- URLs
@pytest.fixture
def http_root(tmp_path, monkeypatch):
    """A directory served over http on 127.0.0.1, and an empty torch hub directory for the cache."""
    import functools
    import http.server
    import threading
    root = tmp_path / 'served'
    root.mkdir()
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    handler.log_message = lambda *args: None
    server = http.server.ThreadingHTTPServer(('127.0.0.1', 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    for name in ('no_proxy', 'NO_PROXY'):
        monkeypatch.setenv(name, '127.0.0.1,localhost')
    monkeypatch.setattr(torch.hub, '_hub_dir', str(tmp_path / 'hub'))
    yield root, f'http://127.0.0.1:{server.server_address[1]}'
    server.shutdown()
    server.server_close()


def _cached_files(hub):
    return sorted(p.relative_to(hub) for p in hub.rglob('*') if p.is_file()) if hub.exists() else []


def test_mmengine_url_scheme_is_ours():
    from vit_plugin.checkpoint.safe_load import load_url_checkpoint
    assert CheckpointLoader._get_checkpoint_loader('https://example.org/model.pth') is load_url_checkpoint


def test_urls_ending_in_the_same_file_name_do_not_share_a_cache_entry(http_root, tmp_path):
    root, base = http_root
    for run, value in (('run_a', 1.), ('run_b', 2.)):
        (root / run).mkdir()
        torch.save({'state_dict': {'w': torch.full((3, ), value)}}, root / run / 'model.pth')
    first = _load_checkpoint(f'{base}/run_a/model.pth')
    second = _load_checkpoint(f'{base}/run_b/model.pth')
    assert first['state_dict']['w'].tolist() == [1.] * 3
    assert second['state_dict']['w'].tolist() == [2.] * 3  # not run_a's file from the cache
    cached = _cached_files(tmp_path / 'hub')
    assert len(cached) == 2 and all(p.name == 'model.pth' for p in cached)
    (root / 'run_b' / 'model.pth').unlink()  # the second load comes from the cache
    assert _load_checkpoint(f'{base}/run_b/model.pth')['state_dict']['w'].tolist() == [2.] * 3


def test_hash_prefix_in_the_file_name_is_checked(http_root, tmp_path):
    import hashlib
    root, base = http_root
    torch.save({'state_dict': {'w': torch.ones(3)}}, root / 'weights.pth')
    data = (root / 'weights.pth').read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    wrong = ('0' if digest[0] != '0' else '1') + digest[1:8]
    (root / f'weights-{wrong}.pth').write_bytes(data)
    (root / f'weights-{digest[:8]}.pth').write_bytes(data)
    with pytest.raises(CheckpointError) as err:
        _load_checkpoint(f'{base}/weights-{wrong}.pth')
    message = str(err.value)
    assert f'weights-{wrong}.pth' in message and wrong in message and digest in message
    assert 'nothing was cached' in message
    assert _cached_files(tmp_path / 'hub') == []  # no file, no partial download left
    ckpt = _load_checkpoint(f'{base}/weights-{digest[:8]}.pth')
    assert torch.equal(ckpt['state_dict']['w'], torch.ones(3))
    assert [p.name for p in _cached_files(tmp_path / 'hub')] == [f'weights-{digest[:8]}.pth']
