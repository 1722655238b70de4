"""Synthetic checkpoints in the official JAX layout, for the converter and loading-path tests.

The arrays are random but laid out exactly as the official release stores them (names, HWIO
kernels, per-head attention kernels), in each naming variant the converters must understand.
"""
import numpy as np

TINY = dict(dim=32, heads=4, mlp=64, depth=2, patch=8, grid=(4, 4), classes=5)
NAMINGS = {'pre-linen': (1, 2, 3), 'linen': (0, 1, 0)}


def official_arrays(naming='pre-linen', prefix='', token=True, pre_logits=None, head=True, scanned=False,
                    big_vision_pos=False, hybrid_layers=None, gn_4d=False, seed=0, dim=32, heads=4, mlp=64,
                    depth=2, patch=8, grid=(4, 4), classes=5, in_chans=3):
    """Dict of official-layout arrays for a tiny ViT (or R50-style hybrid when ``hybrid_layers``)."""
    rng = np.random.default_rng(seed)

    def rand(*shape, scale=0.2):
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    def norm_params(c):
        shape = (1, 1, 1, c) if gn_4d else (c, )
        return 1 + rand(*shape, scale=0.1), rand(*shape, scale=0.1)

    a = {}
    emb_in = in_chans
    if hybrid_layers is not None:
        a['conv_root/kernel'] = rand(7, 7, in_chans, 64)
        a['gn_root/scale'], a['gn_root/bias'] = norm_params(64)
        cin = 64
        for s, units in enumerate(hybrid_layers, start=1):
            width = 64 * 2**(s - 1)
            for u in range(1, units + 1):
                p = f'block{s}/unit{u}/'
                a[p + 'conv1/kernel'] = rand(1, 1, cin, width)
                a[p + 'conv2/kernel'] = rand(3, 3, width, width)
                a[p + 'conv3/kernel'] = rand(1, 1, width, 4 * width)
                for n, c in ((1, width), (2, width), (3, 4 * width)):
                    a[p + f'gn{n}/scale'], a[p + f'gn{n}/bias'] = norm_params(c)
                if u == 1:
                    a[p + 'conv_proj/kernel'] = rand(1, 1, cin, 4 * width)
                    a[p + 'gn_proj/scale'], a[p + 'gn_proj/bias'] = norm_params(4 * width)
                cin = 4 * width
        emb_in = cin
    a['embedding/kernel'] = rand(patch, patch, emb_in, dim)
    a['embedding/bias'] = rand(dim)
    if token:
        a['cls'] = rand(1, 1, dim)
    n = grid[0] * grid[1] + int(token)
    a['pos_embedding' if big_vision_pos else 'Transformer/posembed_input/pos_embedding'] = rand(1, n, dim)
    a['Transformer/encoder_norm/scale'], a['Transformer/encoder_norm/bias'] = 1 + rand(dim), rand(dim)
    attn, ln2, mlp_i = NAMINGS[naming]
    blocks = []
    for _ in range(depth):
        b = {}
        b['LayerNorm_0/scale'], b['LayerNorm_0/bias'] = 1 + rand(dim), rand(dim)
        b[f'LayerNorm_{ln2}/scale'], b[f'LayerNorm_{ln2}/bias'] = 1 + rand(dim), rand(dim)
        m = f'MultiHeadDotProductAttention_{attn}/'
        for q in ('query', 'key', 'value'):
            b[m + f'{q}/kernel'] = rand(dim, heads, dim // heads)
            b[m + f'{q}/bias'] = rand(heads, dim // heads)
        b[m + 'out/kernel'] = rand(heads, dim // heads, dim)
        b[m + 'out/bias'] = rand(dim)
        b[f'MlpBlock_{mlp_i}/Dense_0/kernel'], b[f'MlpBlock_{mlp_i}/Dense_0/bias'] = rand(dim, mlp), rand(mlp)
        b[f'MlpBlock_{mlp_i}/Dense_1/kernel'], b[f'MlpBlock_{mlp_i}/Dense_1/bias'] = rand(mlp, dim), rand(dim)
        blocks.append(b)
    if scanned:
        for k in blocks[0]:
            a[f'Transformer/encoderblock/{k}'] = np.stack([b[k] for b in blocks])
    else:
        for i, b in enumerate(blocks):
            a.update({f'Transformer/encoderblock_{i}/{k}': v for k, v in b.items()})
    width = dim
    if pre_logits:
        a['pre_logits/kernel'], a['pre_logits/bias'] = rand(dim, pre_logits), rand(pre_logits)
        width = pre_logits
    if head:
        a['head/kernel'], a['head/bias'] = rand(width, classes), rand(classes)
    return {prefix + k: v for k, v in a.items()}


def save_npz(path, arrays):
    np.savez(path, **arrays)
    return str(path)
