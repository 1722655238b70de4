"""The checkpoint file conversion behind tools/convert_checkpoint.py: fine-tuning output that init_cfg
loads, errors that name the problem and leave no file, atomic writes, both torch formats, the progress
bar, a patch-size change, and weights without a recorded resize mode."""
import os
import os.path as osp

import numpy as np
import pytest
import torch

from helpers.official_npz import official_arrays, save_npz
from helpers.timm_models import TINY, timm_vit
from vit_plugin.converters import convert_jax_vit
from vit_plugin.models import ViT


# ----------------------------------------------------------------------------- the command-line tool
def _tool():
    from vit_plugin.cli.convert_checkpoint import main
    return main


def test_tool_converts_for_finetuning_and_loads_with_init_cfg(tmp_path, capsys):
    src = save_npz(tmp_path / 'in21k.npz', official_arrays(pre_logits=24))
    dst = str(tmp_path / 'ft.pth')
    assert _tool()([src, dst, '--num-classes', '3', '--img-size', '48', '--arch', 'b']) == 1
    assert "embed_dims=32 (from 'embedding/kernel') where ViT-b has 768" in capsys.readouterr().err
    assert not osp.exists(dst)
    assert _tool()([src, dst, '--num-classes', '3', '--img-size', '48']) == 0
    out = capsys.readouterr().out
    assert 'resized: backbone.pos_embed: 4x4 -> 6x6 patch grid (mode=official)' in out
    assert 'dropped: head.layers.pre_logits.weight' in out and 'missing 0, unknown 0' in out
    model = ViT(arch=TINY, img_size=48, patch_size=8,
                init_cfg=dict(type='Pretrained', checkpoint=dst, prefix='backbone.'))
    model.init_weights()
    arrays = official_arrays(pre_logits=24)
    table = torch.from_numpy(arrays['Transformer/posembed_input/pos_embedding'])
    from scipy import ndimage
    ref = ndimage.zoom(table[0, 1:].reshape(4, 4, 32).numpy(), (1.5, 1.5, 1), order=1)
    np.testing.assert_allclose(model.pos_embed[0, 1:].detach().reshape(6, 6, 32).numpy(), ref, atol=1e-6)
    head = torch.load(dst, weights_only=True)['state_dict']['head.layers.head.weight']
    assert head.shape == (3, 32) and not head.any()


def test_tool_errors_name_the_problem_and_leave_no_file(tmp_path, capsys):
    tool = _tool()
    good = save_npz(tmp_path / 'good.npz', official_arrays())
    truncated = tmp_path / 'truncated.npz'
    truncated.write_bytes(open(good, 'rb').read()[:5000])
    dst = tmp_path / 'out.pth'
    assert tool([str(truncated), str(dst)]) == 1
    assert 'truncated' in capsys.readouterr().err

    torch.save(ViT(arch=TINY, img_size=32, patch_size=8).state_dict(), tmp_path / 'ours.pth')
    half = tmp_path / 'half.pth'
    half.write_bytes((tmp_path / 'ours.pth').read_bytes()[:3000])
    assert tool([str(half), str(dst)]) == 1
    assert 'truncated' in capsys.readouterr().err

    odd = save_npz(tmp_path / 'odd.npz', official_arrays(grid=(4, 7)))
    assert tool([odd, str(dst)]) == 1
    err = capsys.readouterr().err
    assert 'Transformer/posembed_input/pos_embedding' in err and 'pos_embed_grid=(rows, cols)' in err
    assert tool([odd, str(dst), '--pos-embed-grid', '4', '7']) == 0
    assert torch.load(dst, weights_only=True)['state_dict']['backbone.pos_embed_grid'].tolist() == [4, 7]
    os.remove(dst)

    arrays = official_arrays()
    arrays['Transformer/encoderblock_0/LayerScale_0/scale'] = np.ones(32, np.float32)
    extra = save_npz(tmp_path / 'extra.npz', arrays)
    assert tool([extra, str(dst)]) == 1
    assert "'Transformer/encoderblock_0/LayerScale_0/scale'" in capsys.readouterr().err
    del arrays['Transformer/encoder_norm/scale']
    missing = save_npz(tmp_path / 'missing.npz', arrays)
    assert tool([missing, str(dst), '--allow-unknown']) == 1
    assert "'Transformer/encoder_norm/scale'" in capsys.readouterr().err
    assert not dst.exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith('.partial')] == []


def test_tool_write_is_atomic(tmp_path, monkeypatch, capsys):
    tool = _tool()
    src = save_npz(tmp_path / 'vit.npz', official_arrays())
    dst = tmp_path / 'out.pth'
    dst.write_bytes(b'previous contents')
    real_save = torch.save

    def failing_save(obj, f, *args, **kwargs):
        real_save(obj, f, *args, **kwargs)
        f.flush()
        raise OSError('disk full')
    monkeypatch.setattr(torch, 'save', failing_save)
    with pytest.raises(OSError, match='disk full'):
        tool([src, str(dst)])
    assert dst.read_bytes() == b'previous contents'
    assert sorted(p.name for p in tmp_path.iterdir()) == ['out.pth', 'vit.npz']


def test_tool_torch_formats_both_ways(tmp_path, capsys):
    tool = _tool()
    torch.manual_seed(0)
    ref = timm_vit()
    torch.save(ref.state_dict(), tmp_path / 'timm.pth')
    assert tool([str(tmp_path / 'timm.pth'), str(tmp_path / 'ours.pth'), '--arch', 's']) == 1
    assert "embed_dims=32 (from 'backbone.pos_embed') where ViT-s has 384" in capsys.readouterr().err
    assert tool([str(tmp_path / 'timm.pth'), str(tmp_path / 'ours.pth')]) == 0  # layout detected
    ours = torch.load(tmp_path / 'ours.pth', weights_only=True)
    assert ours['meta']['source_format'] == 'timm' and 'head.layers.head.weight' in ours['state_dict']
    assert tool([str(tmp_path / 'ours.pth'), str(tmp_path / 'back.pth'), '--dst-format', 'timm']) == 0
    back = torch.load(tmp_path / 'back.pth', weights_only=True)
    assert back.keys() == ref.state_dict().keys()
    assert all(torch.equal(back[k], v) for k, v in ref.state_dict().items())
    assert tool([str(tmp_path / 'ours.pth'), str(tmp_path / 'bb.pth'), '--backbone-only']) == 0
    bare = torch.load(tmp_path / 'bb.pth', weights_only=True)['state_dict']
    ViT(arch=TINY, img_size=32, patch_size=8).load_state_dict(bare, strict=True)
    assert tool([str(tmp_path / 'bb.pth'), str(tmp_path / 'ft.pth'), '--num-classes', '2', '--img-size', '48']) == 0
    ft = torch.load(tmp_path / 'ft.pth', weights_only=True)['state_dict']
    assert ft['backbone.pos_embed'].shape == (1, 37, 32) and ft['head.layers.head.weight'].shape == (2, 32)


def test_progress_bar_for_large_files(capsys):
    convert_jax_vit(official_arrays(), show_progress=True)
    err = capsys.readouterr().err
    assert 'converting checkpoint' in err and '32/32' in err  # one step per converted tensor


def test_tool_patch_size_change(tmp_path, capsys):
    src = save_npz(tmp_path / 'p8.npz', official_arrays())
    dst = tmp_path / 'p4.pth'
    assert _tool()([src, str(dst), '--patch-size', '4']) == 0
    out = capsys.readouterr().out
    assert 'patch_embed.proj.weight: 8x8 -> 4x4 kernel' in out and '4x4 -> 8x8 patch grid (mode=official)' in out
    checkpoint = torch.load(dst, weights_only=True)
    cfg = checkpoint['meta']['model_cfg']
    assert cfg['patch_size'] == (4, 4) and cfg['img_size'] == (32, 32)
    model = ViT(arch=TINY, img_size=32, patch_size=4)
    model.load_state_dict({k[9:]: v for k, v in checkpoint['state_dict'].items() if k.startswith('backbone.')})
    kernel = torch.from_numpy(official_arrays()['embedding/kernel'].transpose(3, 2, 0, 1).copy())
    from vit_plugin.models import resize_patch_embed
    torch.testing.assert_close(model.patch_embed.proj.weight.detach(), resize_patch_embed(kernel, 4))


def test_tool_resizes_unrecorded_weights_like_the_models_do(tmp_path, capsys):
    """Weights that record no resize mode are resized by the converter with the same rule as by a
    model that loads them: the official loader's (scipy.ndimage.zoom(order=1))."""
    from scipy import ndimage
    torch.manual_seed(0)
    src = ViT(arch=TINY, img_size=32, patch_size=8)
    src.init_weights()
    torch.save(src.state_dict(), tmp_path / 'ours.pth')
    assert _tool()([str(tmp_path / 'ours.pth'), str(tmp_path / 'big.pth'), '--img-size', '48']) == 0
    assert '4x4 -> 6x6 patch grid (mode=official)' in capsys.readouterr().out
    table = torch.load(tmp_path / 'big.pth', weights_only=True)['state_dict']['backbone.pos_embed']
    ref = ndimage.zoom(src.pos_embed.detach()[0, 1:].reshape(4, 4, 32).double().numpy(), (1.5, 1.5, 1), order=1)
    np.testing.assert_allclose(table[0, 1:].reshape(6, 6, 32).double().numpy(), ref, atol=1e-6)
    loaded = ViT(arch=TINY, img_size=48, patch_size=8)
    loaded.load_state_dict(src.state_dict())
    torch.testing.assert_close(loaded.pos_embed.detach(), table, rtol=0, atol=0)
