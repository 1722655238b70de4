"""ViTDet's decomposed relative position bias (use_rel_pos): against timm's SAM attention (an independent
implementation of the same MViTv2 formula), dense analysis maps, zero start, and checkpoint loading."""
import pytest
import torch
from timm.models import vision_transformer_sam as sam

from vit_plugin.models.backbones import ViT
from vit_plugin.models.layers import Attention, windowed_attention
from vit_plugin.models.rel_pos import rel_pos_embeddings

DIMS, HEADS = 48, 3


def _pair(table_grid, seed=0):
    """Our Attention and timm's SAM Attention with the same random weights and non-zero tables."""
    torch.manual_seed(seed)
    ours = Attention(DIMS, HEADS, rel_pos_size=table_grid)
    theirs = sam.Attention(DIMS, HEADS, use_rel_pos=True, input_size=table_grid)
    for p in ours.parameters():
        torch.nn.init.normal_(p, std=0.2)
    theirs.load_state_dict(ours.state_dict())
    return ours.eval(), theirs.eval()


@pytest.mark.parametrize('table_grid, grid', [((5, 6), (5, 6)), ((6, 6), (4, 7))])
def test_global_attention_equals_timm_sam(table_grid, grid):
    """Same grid, and another grid than the tables were made for (linear resize of the tables)."""
    ours, theirs = _pair(table_grid)
    x = torch.randn(2, grid[0] * grid[1], DIMS)
    with torch.no_grad():
        expected = theirs(x.reshape(2, *grid, DIMS)).reshape(2, -1, DIMS)
        torch.testing.assert_close(ours(x, grid=grid), expected, rtol=0, atol=1e-5)
        weights = ours(x, return_attention=True, grid=grid)[1]  # the explicit softmax path agrees
        torch.testing.assert_close(ours(x, grid=grid), ours(x, return_attention=True, grid=grid)[0], rtol=0, atol=1e-5)
    assert weights.shape == (2, HEADS, x.shape[1], x.shape[1])


def test_windowed_attention_equals_timm_sam_windows():
    ws, grid = 3, (6, 9)
    ours, theirs = _pair((ws, ws))
    x = torch.randn(2, grid[0] * grid[1], DIMS)
    with torch.no_grad():
        windows, pad = sam.window_partition(x.reshape(2, *grid, DIMS), ws)
        expected = sam.window_unpartition(theirs(windows), ws, pad, grid).reshape(2, -1, DIMS)
        out = windowed_attention(ours, x, grid, ws, num_prefix_tokens=0)
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-5)


def test_rel_pos_embeddings_index_signed_offsets():
    table = torch.arange(7.)[:, None]  # entry 3 + o for offset o
    emb = rel_pos_embeddings(table, 4)[..., 0]
    assert torch.equal(emb, torch.arange(4.)[:, None] - torch.arange(4.)[None, :] + 3)
    clamped = rel_pos_embeddings(table, 6, span=4)[..., 0]  # offsets beyond +-3 clamp
    assert clamped[5, 0] == 6 and clamped[0, 5] == 0 and clamped[2, 1] == 4


def test_vit_with_class_token_windows_and_padding_matches_dense_maps():
    """The windowed computation (partition, padding mask, prefix keys, window bias) equals the dense
    formulation of the analysis path block by block; class-token rows and columns carry no bias."""
    torch.manual_seed(0)
    model = ViT(arch=dict(embed_dims=DIMS, num_layers=3, num_heads=HEADS, mlp_dims=96), img_size=32, patch_size=8,
                window_size=3, window_block_indices=(0, 2), use_rel_pos=True, out_type='raw').eval()
    for name, p in model.named_parameters():
        if 'rel_pos' in name:
            torch.nn.init.normal_(p, std=0.5)
    x, grid = model.embed(torch.randn(2, 3, 40, 56))  # 5x7 grid: windows of 3 need padding
    with torch.no_grad():
        for block in model.blocks:
            dense, weights = block(x, return_attention=True, grid=grid)
            torch.testing.assert_close(block(x, grid=grid), dense, rtol=0, atol=2e-5)
            x = dense
    attn = model.blocks[1].attn  # global block: the class token's bias row and column are zero
    q = torch.randn(2, HEADS, 1 + 35, DIMS // HEADS)
    bias = attn.rel_pos_bias(q, grid)
    assert bias[..., 0, :].abs().max() == 0 and bias[..., :, 0].abs().max() == 0 and bias[..., 1:, 1:].abs().max() > 0
    with pytest.raises(ValueError, match='patch grid'):
        attn(torch.randn(1, 36, DIMS))


def test_zero_tables_compute_the_checkpoint_function_and_learn():
    """ViTDet's start: a paper checkpoint loaded into a use_rel_pos model computes what it did; the
    tables then get gradients, and no weight decay."""
    kwargs = dict(arch=dict(embed_dims=DIMS, num_layers=2, num_heads=HEADS, mlp_dims=96), img_size=32, patch_size=8,
                  window_size=2, window_block_indices=(0, ), out_type='featmap')
    torch.manual_seed(0)
    plain = ViT(**kwargs)
    plain.init_weights()
    model = ViT(use_rel_pos=True, **kwargs)
    model.load_state_dict(plain.state_dict(), strict=True)  # tables absent: started at zero, nothing missing
    x = torch.randn(2, 3, 32, 40)
    with torch.no_grad():
        torch.testing.assert_close(model.eval()(x)[0], plain.eval()(x)[0], rtol=0, atol=1e-6)
    model.train()(x)[0].square().mean().backward()
    tables = {n: p for n, p in model.named_parameters() if 'rel_pos' in n}
    assert len(tables) == 4 and all(p.grad is not None and p.grad.abs().sum() > 0 for p in tables.values())
    assert set(tables) <= model.no_weight_decay()


def test_loading_resizes_tables_and_refuses_to_drop_them():
    kwargs = dict(arch=dict(embed_dims=DIMS, num_layers=2, num_heads=HEADS, mlp_dims=96), img_size=32, patch_size=8,
                  window_block_indices=(0, ), use_rel_pos=True)
    torch.manual_seed(0)
    source = ViT(window_size=2, **kwargs)
    for name, p in source.named_parameters():
        if 'rel_pos' in name:
            torch.nn.init.normal_(p)
    target = ViT(window_size=4, **kwargs)  # window tables 3 -> 7 entries; the global block's stay 7
    target.load_state_dict(source.state_dict(), strict=True)
    assert target.blocks[0].attn.rel_pos_h.shape == (7, DIMS // HEADS)
    # a linear resize keeps the centre (offset 0) entry
    torch.testing.assert_close(target.blocks[0].attn.rel_pos_h[3], source.blocks[0].attn.rel_pos_h[1])
    torch.testing.assert_close(target.blocks[1].attn.rel_pos_w, source.blocks[1].attn.rel_pos_w)
    no_rel_pos = ViT(**{**kwargs, 'use_rel_pos': False})
    with pytest.raises(ValueError, match='use_rel_pos=True'):
        no_rel_pos.load_state_dict(source.state_dict(), strict=False)
