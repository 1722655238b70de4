"""Windowed attention (ViTDet): a window covering the grid is global attention, the partitioned
computation equals masked dense attention, the mask layout, the choice of windowed blocks, and
activation checkpointing."""
import pytest
import torch

from vit_plugin.models.backbones.vit import ViT
from vit_plugin.models.layers import window_attention_mask


TINY = dict(embed_dims=48, num_layers=4, num_heads=3, mlp_dims=96)


# ---------------------------------------------------------------------------------------------- windows
@pytest.mark.parametrize('with_cls_token', [True, False])
@pytest.mark.parametrize('shape', [(2, 3, 64, 64), (2, 3, 40, 88)])
def test_window_covering_the_grid_equals_global_attention(with_cls_token, shape):
    torch.manual_seed(0)
    common = dict(arch=TINY, img_size=64, patch_size=8, out_type='featmap', with_cls_token=with_cls_token,
                  out_indices=(1, 3))
    glob_model = ViT(**common).eval()
    glob_model.init_weights()
    # window 16 > both grid sides (8x8, 5x11): one (padded, masked) window per image
    win_model = ViT(**common, window_size=16, window_block_indices=(0, 1, 2, 3)).eval()
    win_model.load_state_dict(glob_model.state_dict())
    x = torch.randn(shape)
    for a, b in zip(glob_model(x), win_model(x)):
        torch.testing.assert_close(a, b, atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize('with_cls_token', [True, False])
def test_windowed_attention_matches_dense_masked_attention(with_cls_token):
    """The partitioned (padded) computation equals explicit softmax attention under the window mask."""
    torch.manual_seed(0)
    model = ViT(TINY, img_size=64, patch_size=8, out_type='featmap', with_cls_token=with_cls_token,
                window_size=3, window_block_indices=(0, ))
    model.init_weights()
    tokens, grid = model.embed(torch.randn(2, 3, 56, 80))  # 7x10 grid: windows padded to 9x12
    block = model.blocks[0]
    fast = block(tokens, grid=grid)
    dense, weights = block(tokens, return_attention=True, grid=grid)
    torch.testing.assert_close(fast, dense, atol=2e-5, rtol=1e-5)
    # the windows really restrict attention, and differ from a global block
    allowed = window_attention_mask(grid, 3, int(with_cls_token))
    assert weights.shape[-2:] == allowed.shape
    assert float(weights.detach()[..., ~allowed].abs().max()) == 0
    assert not torch.allclose(fast, model.blocks[1](tokens), atol=1e-3)


def test_window_mask_layout():
    mask = window_attention_mask((3, 4), 2, num_prefix_tokens=1)
    assert mask[0].all() and mask[:, 0].all()  # the class token is global both ways
    patches = mask[1:, 1:]
    # patch (0,0) sees (0,1), (1,0), (1,1) and not (0,2); patch (2,3) sees only (2,2)
    index = lambda r, c: r * 4 + c  # noqa: E731
    assert patches[index(0, 0), [index(0, 1), index(1, 0), index(1, 1)]].all()
    assert not patches[index(0, 0), index(0, 2)]
    assert patches[index(2, 3)].nonzero().flatten().tolist() == [index(2, 2), index(2, 3)]


def test_window_block_selection_and_errors():
    assert ViT(TINY | dict(num_layers=12), window_size=14).window_block_indices == (0, 1, 3, 4, 6, 7, 9, 10)
    large = ViT(dict(embed_dims=32, num_layers=24, num_heads=2, mlp_dims=32), window_size=14)
    assert [i for i in range(24) if i not in large.window_block_indices] == [5, 11, 17, 23]
    assert ViT(TINY).window_block_indices == ()
    assert ViT(TINY, window_size=4, window_block_indices=(-1, 0)).window_block_indices == (0, 3)
    with pytest.raises(ValueError, match='out of range'):
        ViT(TINY, window_size=4, window_block_indices=(4, ))
    with pytest.raises(ValueError, match='window_size'):
        ViT(TINY, window_size=-1)
    model = ViT(TINY, img_size=32, patch_size=8, window_size=2, window_block_indices=(0, ))
    with pytest.raises(ValueError, match='grid'):
        model.blocks[0](torch.randn(1, 17, 48))


def test_windowed_blocks_train_with_activation_checkpointing():
    torch.manual_seed(0)
    model = ViT(TINY, img_size=64, patch_size=8, out_type='featmap', window_size=3, window_block_indices=(0, 2))
    model.init_weights()
    x = torch.randn(2, 3, 48, 72)
    model.train()
    model(x)[0].square().mean().backward()
    expected = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    model.set_grad_checkpointing(True)
    model(x)[0].square().mean().backward()
    for name, param in model.named_parameters():
        torch.testing.assert_close(param.grad, expected[name], atol=1e-6, rtol=1e-5, msg=name)
