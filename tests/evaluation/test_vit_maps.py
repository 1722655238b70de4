"""The quantities behind the paper's Figures 6-7: attention distance, rollout, position-embedding
similarity and the patch-embedding components."""
import math

import numpy as np
import pytest
import torch

from vit_plugin.evaluation.vit_maps import (attention_rollout, mean_attention_distance, patch_embedding_components,
                                           pos_embed_similarity, rollout_to_map)


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
