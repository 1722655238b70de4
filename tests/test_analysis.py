"""Analysis of the paper's Figures 6-7 and the model summary: the quantities, the figures, the tools."""
import importlib
import math
import os.path as osp

import numpy as np
import pytest
import torch

import vit_plugin  # noqa: F401
from vit_plugin.analysis import (attention_rollout, mean_attention_distance, patch_embedding_components,
                                 pos_embed_similarity, rollout_to_map, summary_rows, vit_flops, vit_param_count)
from vit_plugin.analysis.complexity import measure_model
from vit_plugin.models.backbones.vit import ViT

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))
TINY = dict(embed_dims=32, num_layers=2, num_heads=2, mlp_dims=64)


# ---------------------------------------------------------------- the quantities
def test_attention_distance_of_hand_built_patterns():
    # 2x2 grid of 16 px patches, no class token, every query attends uniformly to all 4 patches:
    # from any patch the distances are 0, 16, 16 and 16*sqrt(2) px.
    uniform = torch.full((1, 1, 4, 4), 0.25)
    expected = 16 * (0 + 1 + 1 + math.sqrt(2)) / 4
    assert mean_attention_distance(uniform, (2, 2), (16, 16), 0).item() == pytest.approx(expected)
    # Attending only to oneself: distance 0.
    assert mean_attention_distance(torch.eye(4)[None, None], (2, 2), (16, 16), 0).item() == 0
    # 1x3 grid of 8x16 px patches with a class token: query patch 0 gives half its weight to the class
    # token and half to patch 2 (32 px right), patch 1 everything to patch 0 (16 px), patch 2 to
    # itself. The class token's share is dropped and the rest renormalised: (32 + 16 + 0) / 3 per head.
    attn = torch.zeros(1, 2, 4, 4)
    attn[:, :, 0, 0] = 1
    attn[:, :, 1, 0], attn[:, :, 1, 3] = 0.5, 0.5
    attn[:, :, 2, 1] = 1
    attn[:, :, 3, 3] = 1
    out = mean_attention_distance(attn, (1, 3), (8, 16), 1)
    assert out.shape == (1, 2) and torch.allclose(out, torch.full((1, 2), 16.0, dtype=torch.float64))
    with pytest.raises(ValueError, match='N = 1 \\+ 2\\*2'):
        mean_attention_distance(attn, (2, 2), (16, 16), 1)


def test_rollout_of_identity_and_uniform_attention():
    n, grid = 1 + 9, (3, 3)
    identity = [torch.eye(n).expand(2, 3, n, n)] * 4
    rollout = attention_rollout(identity)
    assert torch.allclose(rollout, torch.eye(n, dtype=torch.float64).expand(2, n, n))
    # The class token only ever sees itself: no patch contributes, the map is uniform (all zero).
    assert torch.equal(rollout_to_map(rollout, grid), torch.zeros(2, 3, 3, dtype=torch.float64))
    # Uniform attention without the residual path: every input contributes 1/N to every output.
    uniform = [torch.full((1, 2, n, n), 1.0 / n)] * 3
    maps = rollout_to_map(attention_rollout(uniform, residual=False), grid)
    assert torch.allclose(maps, torch.full((1, 3, 3), 1.0 / n, dtype=torch.float64))
    # With the residual path, two layers of uniform attention: R = B @ B with B = (U + I) / 2.
    both = attention_rollout(uniform[:2], residual=True)
    b = 0.5 * torch.full((n, n), 1.0 / n, dtype=torch.float64) + 0.5 * torch.eye(n, dtype=torch.float64)
    assert torch.allclose(both[0], b @ b)
    # A gap model (no class token): the output is the mean of the patch tokens' rows.
    gap = rollout_to_map(torch.eye(9, dtype=torch.float64)[None], grid, num_prefix_tokens=0)
    assert torch.allclose(gap, torch.full((1, 3, 3), 1.0 / 9, dtype=torch.float64))


def test_pos_embed_similarity_sees_rows():
    rows, cols, dims = 3, 4, 8
    table = torch.randn(rows, dims).repeat_interleave(cols, dim=0)  # one embedding per row
    pos_embed = torch.cat([torch.randn(1, dims), table])[None]
    sim = pos_embed_similarity(pos_embed, (rows, cols), num_prefix_tokens=1)
    assert sim.shape == (rows, cols, rows, cols)
    assert torch.allclose(sim[1, 2, 1], torch.ones(cols))  # same row: identical embeddings
    expected = torch.nn.functional.cosine_similarity(table[0], table[cols], dim=0)
    assert torch.allclose(sim[0, 0, 1, 3], expected, atol=1e-6)
    with pytest.raises(ValueError, match='3x3 grid'):
        pos_embed_similarity(pos_embed, (3, 3))


def test_patch_embedding_components_equal_sklearn_pca():
    from sklearn.decomposition import PCA

    weight = torch.randn(64, 3, 4, 4) * torch.linspace(3, 0.1, 48).reshape(1, 3, 4, 4)
    comps, explained = patch_embedding_components(weight, num_components=5)
    pca = PCA(n_components=5, svd_solver='full').fit(weight.flatten(1).double().numpy())
    flat = comps.flatten(1).numpy()
    for mine, ref in zip(flat, pca.components_):
        assert abs(abs(float(mine @ ref)) - 1) < 1e-5  # same direction up to sign
    np.testing.assert_allclose(explained.numpy(), pca.explained_variance_ratio_, rtol=1e-5)


def test_parameter_counts_equal_the_official_models_and_flops_equal_torch():
    official = {('base', 16): 86_567_656, ('base', 32): 88_224_232, ('large', 16): 304_326_632,
                ('large', 32): 306_535_400, ('huge', 14): 632_045_800}
    for (arch, patch), count in official.items():
        assert vit_param_count(arch, patch, 224) == count
    vit = ViT(arch=TINY, img_size=(24, 32), patch_size=8).eval()
    params, macs = measure_model(vit, (1, 3, 24, 32))
    assert params == vit_param_count(TINY, 8, (24, 32), num_classes=0)
    assert macs == vit_flops(TINY, 8, (24, 32), num_classes=0)
    b16 = next(r for r in summary_rows() if r['model'] == 'ViT-B/16' and r['resolution'] == 224)
    assert b16['paper_params'] == '86M' and b16['tokens'] == 197 and b16['gflops'] == pytest.approx(17.56, abs=0.01)


# ---------------------------------------------------------------- the tools, on a tiny model of a real config
@pytest.fixture(scope='module')
def tiny(tmp_path_factory):
    """A config file (the demo config with a tiny ViT, data in a temp dir), a checkpoint, a wrong one, images."""
    from mmengine.registry import MODELS
    from PIL import Image

    from vit_plugin.analysis import load_config

    tmp = tmp_path_factory.mktemp('analysis')
    cfg_path = tmp / 'tiny_vit.py'
    cfg_path.write_text(f"_base_ = ['{osp.join(REPO, 'configs', 'vit_demo_digits.py')}']\n"
                        f"model = dict(backbone=dict(arch={TINY!r}, img_size=16, patch_size=4),\n"
                        f"             head=dict(in_channels={TINY['embed_dims']}))\n"
                        f"test_dataloader = dict(dataset=dict(data_root='{tmp / 'digits'}'))\n")
    cfg = load_config(str(cfg_path))
    model = MODELS.build(cfg.model)
    model.init_weights()
    torch.save(dict(state_dict=model.state_dict(), meta=dict()), tmp / 'tiny.pth')
    other = ViT(arch=dict(TINY, embed_dims=48), img_size=16, patch_size=4)  # another width
    torch.save(dict(state_dict={f'backbone.{k}': v for k, v in other.state_dict().items()}), tmp / 'other.pth')
    images = []
    for i in range(3):
        path = tmp / f'img{i}.png'
        Image.fromarray((np.random.default_rng(i).random((20, 24, 3)) * 255).astype(np.uint8)).save(path)
        images.append(str(path))
    return dict(config=str(cfg_path), ckpt=str(tmp / 'tiny.pth'), wrong=str(tmp / 'other.pth'), images=images,
                tmp=tmp)


TOOLS = {
    'patch_filters.py': [],
    'pos_embed_similarity.py': [],
    'attention_distance.py': ['--images', '{images}'],
    'attention_rollout.py': ['--images', '{images}'],
}


def _argv(extra, tiny):
    out = []
    for a in extra:
        out += tiny['images'] if a == '{images}' else [a]
    return out


def _assert_png(path):
    assert osp.getsize(path) > 1000
    with open(path, 'rb') as f:
        assert f.read(8) == b'\x89PNG\r\n\x1a\n'


@pytest.mark.parametrize('name', sorted(TOOLS))
def test_tool_writes_png_and_refuses_a_wrong_checkpoint(name, tiny, capsys):
    from vit_plugin.analysis.cli import run

    tool = importlib.import_module(f'vit_plugin.apis.analysis.{name[:-3]}')
    out = str(tiny['tmp'] / name.replace('.py', '.png'))
    assert run(tool.main, [tiny['config'], tiny['ckpt'], '--out', out] + _argv(TOOLS[name], tiny)) == 0
    _assert_png(out)
    assert run(tool.main, [tiny['config'], tiny['wrong'], '--out', out + '.bad.png'] + _argv(TOOLS[name], tiny)) == 2
    err = capsys.readouterr().err
    assert 'does not fit the ViT' in err and 'backbone.' in err and 'pass the config it was trained with' in err
    assert not osp.exists(out + '.bad.png')


def test_model_summary_tool_adds_the_config_row(tiny, capsys):
    from vit_plugin.analysis.cli import run

    from vit_plugin.apis.analysis import model_summary as tool
    out = str(tiny['tmp'] / 'summary.png')
    assert run(tool.main, ['--config', tiny['config'], '--checkpoint', tiny['ckpt'], '--out', out]) == 0
    _assert_png(out)
    table = open(out[:-4] + '.md').read()
    assert '| ViT-H/14 | 224 | 32 | 1280 | 5120 | 16 | 257 | 632.0M | 167.3 | 632M |' in table
    assert '| tiny_vit | 16 | 2 | 32 | 64 | 2 |' in table
    assert run(tool.main, ['--config', tiny['config'], '--checkpoint', tiny['wrong'], '--out', out]) == 2
    assert 'does not fit the ViT' in capsys.readouterr().err


def test_make_figures_uses_the_config_dataset(tiny):
    from vit_plugin.apis.analysis import make_figures as tool
    out_dir = tiny['tmp'] / 'gallery'
    written = tool.main([tiny['config'], tiny['ckpt'], '--out-dir', str(out_dir), '--num-images', '6',
                         '--rollout-images', '3'])
    assert len(written) == 5
    for path in written:
        _assert_png(path)
    import json
    dist = json.load(open(out_dir / 'attention_distance.json'))
    assert dist['num_images'] == 6 and len(dist['mean_distance_px']) == TINY['num_layers']
    assert all(0 <= v <= math.hypot(16, 16) for layer in dist['mean_distance_px'] for v in layer)


def test_tools_refuse_a_model_without_vit(tiny, tmp_path, capsys):
    from vit_plugin.analysis.cli import run

    cfg = tmp_path / 'resnet.py'
    cfg.write_text("default_scope = 'mmpretrain'\n"
                   "model = dict(type='ImageClassifier', backbone=dict(type='ResNet', depth=18),\n"
                   "             head=dict(type='LinearClsHead', num_classes=10, in_channels=512))\n")
    from vit_plugin.apis.analysis import pos_embed_similarity

    assert run(pos_embed_similarity.main, [str(cfg), tiny['ckpt']]) == 2
    assert 'contains no vit_plugin.ViT backbone' in capsys.readouterr().err

