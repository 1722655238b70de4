"""Training memory of a config's model, from its shapes: weights, gradients, optimizer state and
activations, and the largest per-device batch that fits a memory budget.

The activation model is analytic: for every ViT encoder block it adds up the tensors autograd keeps
for the backward pass (the block input of each LayerNorm, the inputs of the four linear layers, the
MLP hidden activations, the attention's saved tensors, dropout masks), in units of one (tokens x
width) map. The attention term depends on the kernel PyTorch picks:

* fused (``scaled_dot_product_attention`` without a trainable bias or attention dropout): q, k, v,
  the output and one log-sum-exp per query -- linear in the tokens;
* explicit ("math" path: relative position bias, whose gradient the fused CPU kernel does not
  provide, or attention dropout): a scaled copy of q, a transposed copy of k and the softmax
  output, heads x queries x keys -- quadratic in the tokens (per window in windowed blocks).

Windowed blocks pad the patch grid to whole windows and copy q, k, v into window order; with a
class token its queries attend globally and its key/value rows are concatenated into every window.
The per-op constants (which copies exist) were read off the saved-tensor trace of the real block
and are checked against it by the tests. Peak memory is then the largest of: the end of the forward
pass plus the start of backward (activations of all blocks and the backward temporaries of the last
one), every later point of the backward pass (activations of blocks not yet processed, gradients of
those done) and the optimizer step (gradients, state and the update's temporaries).

With ``with_cp`` a block keeps only its input and recomputes the rest during backward. With bf16
autocast the linear layers' inputs, outputs and the attention work in 2-byte numbers while the
residual stream and LayerNorm stay fp32, and the bf16 copies of the weights live until backward.

Not modelled: activations of detector necks and heads (feature pyramids, RPN, RoI heads), which the
tool reports as missing rather than guessing; memory of the data loader; allocator fragmentation.

The command (``main``) prints the estimate and the largest batch per memory budget; ``--measure`` also
runs two real training steps on this machine's CPU in a child process (:mod:`.memory_measure`) and
prints their peak next to the estimate. See docs/memory.md.

    python tools/analysis/memory.py CONFIG [--batch N] [--gpu-mem 24GiB [80GiB ...]] [--with-cp] [--bf16]
        [--device {cuda,cpu}] [--measure] [--cfg-options KEY=VALUE ...]
"""
import os.path as osp
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

import torch
import torch.nn as nn

from vit_plugin.cli.common import base_parser
from benchmarks.memory_measure import measure
from vit_plugin.evaluation.model_loading import load_config
from vit_plugin.models.vit_search import find_vit

GiB = 1024**3
MiB = 1024**2


def parse_size(text: str) -> float:
    """'24GiB', '80GB', '512MiB', or a plain number of bytes -> bytes."""
    units = {'gib': GiB, 'gb': 1e9, 'mib': MiB, 'mb': 1e6, 'kib': 1024, 'kb': 1e3, 'b': 1}
    value = str(text).strip().lower().replace(' ', '')
    for unit, scale in units.items():
        if value.endswith(unit):
            return float(value[:-len(unit)]) * scale
    try:
        return float(value)
    except ValueError:
        raise ValueError(f'cannot read memory size {text!r}: use e.g. 24GiB, 80GB or 512MiB') from None


@dataclass
class BlockShape:
    """What the activation model needs of one encoder block."""
    tokens: int  # prefix + patches
    prefix: int
    grid: Tuple[int, int]
    dims: int
    heads: int
    mlp_dims: int
    window: int = 0
    rel_pos: bool = False
    drop: float = 0.
    attn_drop: float = 0.


@dataclass
class Precision:
    """Bytes of the tensors the activation model distinguishes."""
    stream: int = 4  # residual stream, LayerNorm inputs, statistics
    compute: int = 4  # linear inputs/outputs, attention, MLP hidden
    mask: int = 4  # a dropout mask element (CPU dropout keeps a float mask, CUDA a byte)

    @classmethod
    def make(cls, bf16: bool, device: str) -> 'Precision':
        compute = 2 if bf16 else 4
        return cls(stream=4, compute=compute, mask=compute if device == 'cpu' else 1)


def _explicit_attention(block: BlockShape, device: str) -> bool:
    # CPU: a bias that needs a gradient or attention dropout makes SDPA decompose into matmul +
    # softmax (quadratic saved tensor). CUDA's memory-efficient kernel keeps the bias instead, of
    # the same size, so both are modelled with one quadratic tensor.
    return block.rel_pos or (block.attn_drop > 0 and device == 'cpu')


def block_activation_bytes(block: BlockShape, precision: Precision, device: str = 'cpu') -> Dict[str, float]:
    """Bytes one image's pass through ``block`` keeps for backward, by term.

    Args:
        block (BlockShape): The block.
        precision (Precision): Element sizes.
        device (str): ``'cpu'`` or ``'cuda'`` (the attention kernel and dropout masks differ).

    Returns:
        dict: Terms in bytes: ``stream``, ``linear``, ``mlp``, ``attention``, ``dropout``, and
        ``temporaries`` (the largest extra memory while the block's backward runs; not kept).
    """
    T, P, D, H, M = block.tokens, block.prefix, block.dims, block.heads, block.mlp_dims
    s, c = precision.stream, precision.compute
    TD = T * D
    explicit = _explicit_attention(block, device)
    terms = dict(stream=(2 * TD + 4 * T) * s,  # the two LayerNorm inputs and their mean/rstd
                 linear=2 * TD * c,  # inputs of qkv and fc1 (LayerNorm outputs)
                 mlp=2 * T * M * c)  # GELU input and fc2 input
    if not block.window:
        keys = T
        attn = 3 * TD  # the qkv output, of which q, k, v are views
        if explicit:
            # With the relative-position tables two more (tokens x width) copies are kept (the
            # scaled/transposed operands of the biased product); attention dropout alone keeps none.
            attn += (2 if block.rel_pos else 0) * TD
            quad = H * T * keys * (3 if block.attn_drop and device == 'cpu' else 1)
            attn += quad
            attn += TD  # output projection input (heads merged: a copy)
            lse = 0
        else:
            attn += TD  # output, also the output projection input (a view)
            lse = H * T
    else:
        rows, cols = block.grid
        ws = block.window
        nr, nc = -(-rows // ws), -(-cols // ws)
        padded = nr * nc * ws * ws
        pD = padded * D
        attn = 3 * pD  # q, k, v in window order (one copy of the padded grid)
        if P:
            attn += 3 * TD  # the qkv output stays alive: the class token's queries attend to it
            attn += 2 * nr * nc * (P + ws * ws) * D  # keys/values with the class token per window
        if explicit:
            # Scaled q and transposed k, and without a class token q regrouped for the tables.
            attn += (2 if P else 3) * pD
            attn += H * nr * nc * ws * ws * (P + ws * ws) * (3 if block.attn_drop and device == 'cpu' else 1)
            lse = 0
        else:
            attn += pD  # kernel output
            lse = H * padded
        # Output projection input: with a class token a concatenation (unpadded); otherwise the
        # window-order output reshaped, a view of the padded copy unless columns were padded.
        attn += TD if P or cols % ws else pD
    terms['attention'] = attn * c + lse * 4
    if block.drop > 0:
        # proj_drop, the MLP's two dropouts: a mask each.
        terms['dropout'] = (2 * TD + T * M) * precision.mask
    else:
        terms['dropout'] = 0
    if block.window:
        quad_tmp = H * nr * nc * ws * ws * (P + ws * ws) if explicit else 0
    else:
        quad_tmp = H * T * T if explicit else 0
    # Backward temporaries, from the block's largest tensors: two gradients of the MLP's hidden
    # activations, or of the attention matrix in the explicit path, plus two (tokens x width) maps.
    terms['temporaries'] = max(2 * T * M, 2 * quad_tmp) * c + 2 * TD * s
    return terms


@dataclass
class ModelShape:
    """A config's model as the memory model sees it."""
    name: str
    blocks: List[BlockShape]
    image_hw: Tuple[int, int]
    in_channels: int
    params: int
    trainable: int
    linear_params: int
    block_params: List[int]
    optimizer: str
    largest_param: int = 0
    optimizer_kernel: Optional[str] = None  # 'fused', 'foreach' or 'loop' when the config says
    pos_drop: float = 0.
    with_cp: bool = False
    detector: bool = False
    notes: List[str] = field(default_factory=list)


def _kernel(optimizer_cfg: dict) -> Optional[str]:
    """The update kernel a config's optimizer asks for (None: the run's default)."""
    if optimizer_cfg.get('fused'):
        return 'fused'
    if 'foreach' in optimizer_cfg:
        return 'foreach' if optimizer_cfg['foreach'] else 'loop'
    return None


def _state_per_param(optimizer: str) -> int:
    name = optimizer.split('.')[-1].lower()
    if name in ('adamw', 'adam', 'lamb', 'adamax', 'nadam', 'radam'):
        return 2
    if name in ('sgd', 'rmsprop', 'adagrad', 'lars'):
        return 1  # momentum / square average
    return 2


@dataclass
class Estimate:
    """Bytes of one training step at ``batch`` images per device, by part, and the peak."""
    batch: int
    weights: float
    grads: float
    optimizer_state: float
    activations: float
    peak: float
    peak_phase: str


def estimate(model: ModelShape, batch: int, *, with_cp: Optional[bool] = None, bf16: bool = False,
             device: str = 'cpu') -> Estimate:
    """Peak training memory of ``model`` at ``batch`` images per device (see the module docstring).

    Args:
        model (ModelShape): From :func:`model_shape`.
        batch (int): Images per device.
        with_cp (bool, optional): Activation checkpointing per block; None keeps the config's.
        bf16 (bool): bf16 autocast (weights, gradients and optimizer state stay fp32).
        device (str): ``'cpu'`` or ``'cuda'``. Defaults to ``'cpu'``.

    Returns:
        Estimate: The parts and the peak, in bytes.
    """
    cp = model.with_cp if with_cp is None else with_cp
    prec = Precision.make(bf16, device)
    weights = 4. * model.params
    grads = 4. * model.trainable
    state = 4. * _state_per_param(model.optimizer) * model.trainable
    H, W = model.image_hw
    first = model.blocks[0]
    # Before the blocks: the normalised image (saved by the patch projection) and the dropout
    # mask after the position embedding; after them: the final LayerNorm's input and output.
    # Stochastic depth keeps one number per image and block: left out.
    pre = model.in_channels * H * W * 4 + (first.tokens * first.dims * prec.mask if model.pos_drop else 0)
    post = 2 * first.tokens * first.dims * prec.stream
    cast_weights = 2. * model.linear_params if bf16 else 0.  # autocast's bf16 weight copies
    per_block = [block_activation_bytes(b, prec, device) for b in model.blocks]
    kept = [sum(v for k, v in t.items() if k != 'temporaries') for t in per_block]
    temps = [t['temporaries'] for t in per_block]
    block_in = [b.tokens * b.dims * prec.stream for b in model.blocks]
    saved = [bi if cp else k for bi, k in zip(block_in, kept)]
    activations = batch * (pre + sum(saved) + post) + cast_weights
    fixed = weights + state
    # Backward walks the blocks from the last: at block i, the activations of blocks <= i are
    # alive (block i's recomputed ones with checkpointing) and the gradients of blocks > i exist.
    nonblock_grads = grads - 4. * sum(model.block_params)
    peak, phase = 0., ''
    last = len(model.blocks) - 1
    for i in range(last, -1, -1):
        recomputed = kept[i] if cp else 0
        alive = batch * (pre + sum(saved[:i + 1]) + recomputed + temps[i] + (post if i == last else 0))
        grads_done = nonblock_grads + 4. * sum(model.block_params[i + 1:])
        value = fixed + alive + grads_done + cast_weights
        if value > peak:
            peak, phase = value, f'backward of block {i}'
    # The optimizer step: gradients, state and the update's temporaries, by kernel (tools/train.py
    # picks the fused one on CUDA, torch's per-tensor loop stays on the CPU, unless the config says
    # otherwise). The loop holds two temporaries of the largest tensor (the square root of the second
    # moment and the denominator made from it), foreach a parameter-sized list (the square roots of
    # all second moments), the fused kernel none. SGD with momentum updates in place.
    adam = _state_per_param(model.optimizer) == 2
    kernel = model.optimizer_kernel or ('fused' if device == 'cuda' else 'loop')
    update_tmp = 0.
    if adam:
        update_tmp = {'loop': 2. * model.largest_param, 'foreach': float(model.trainable), 'fused': 0.}[kernel] * 4
    step = fixed + grads + update_tmp
    if step > peak:
        peak, phase = step, 'optimizer step'
    return Estimate(batch, weights, grads, state, activations, peak, phase)


def largest_batch(model: ModelShape, budget: float, **kwargs) -> int:
    """The largest per-device batch whose estimated peak is within ``budget`` bytes (0 if none)."""
    if estimate(model, 1, **kwargs).peak > budget:
        return 0
    lo, hi = 1, 2
    while estimate(model, hi, **kwargs).peak <= budget and hi < 1 << 20:
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if estimate(model, mid, **kwargs).peak <= budget else (lo, mid)
    return lo


def _find_vit(model: nn.Module):
    return find_vit(model)[0]


def model_shape(cfg, name: str = 'model', backbone_only: bool = False) -> ModelShape:
    """Build the config's model on the meta device (no memory, no weights) and read its shapes.

    Args:
        cfg (mmengine.Config): A loaded config (custom imports done, default scope set).
        name (str): Label for tables.
        backbone_only (bool): Count only the ViT's parameters (what the CPU measurement of a
            detector trains). Defaults to False.

    Returns:
        ModelShape: Parameter counts from the real model; block shapes from its ViT.
    """
    from mmengine.registry import MODELS

    with torch.device('meta'):
        model = MODELS.build(cfg.model)
    vit = _find_vit(model)
    counted = vit if backbone_only else model
    params = sum(p.numel() for p in counted.parameters())
    trainable = sum(p.numel() for p in counted.parameters() if p.requires_grad)
    linear = sum(m.weight.numel() for m in counted.modules() if isinstance(m, nn.Linear))
    grid = tuple(vit._patch_grid)
    prefix = vit.num_prefix_tokens
    tokens = prefix + grid[0] * grid[1]
    blocks, block_params = [], []
    for blk in vit.blocks:
        blocks.append(BlockShape(
            tokens=tokens, prefix=prefix, grid=grid, dims=vit.embed_dims, heads=blk.attn.num_heads,
            mlp_dims=blk.mlp.fc1.out_features, window=blk.window_size, rel_pos=blk.attn.use_rel_pos,
            drop=blk.mlp.drop1.p, attn_drop=blk.attn.attn_drop))
        block_params.append(sum(p.numel() for p in blk.parameters() if p.requires_grad))
    optimizer_cfg = cfg.get('optim_wrapper', {}).get('optimizer', {})
    optimizer = optimizer_cfg.get('type', 'AdamW')
    detector = getattr(model, 'neck', None) is not None or not hasattr(model, 'head')
    notes = []
    if detector:
        notes.append('activations of the ViT backbone only: the neck and detection heads are not '
                     'modelled' + ('' if backbone_only else ' (their parameters are counted)'))
    patch = tuple(vit.patch_size)
    return ModelShape(name=name, blocks=blocks, image_hw=(grid[0] * patch[0], grid[1] * patch[1]),
                      in_channels=3, params=params, trainable=trainable, linear_params=linear,
                      block_params=block_params, optimizer=optimizer, pos_drop=vit.drop_after_pos.p,
                      largest_param=max(p.numel() for p in counted.parameters() if p.requires_grad),
                      optimizer_kernel=_kernel(optimizer_cfg),
                      with_cp=bool(getattr(vit.blocks[0], 'with_cp', False)), detector=detector, notes=notes)


def fmt_bytes(n: float) -> str:
    return f'{n / GiB:.2f} GiB' if n >= GiB else f'{n / MiB:.0f} MiB'


def main(argv=None):
    parser = base_parser('Plan training memory: weights, gradients, optimizer state, activations, the largest batch '
                         'that fits.', with_model=False)
    parser.add_argument('config', help='training config')
    parser.add_argument('--batch', type=int, default=None,
                        help='images per device (default: the config\'s train_dataloader.batch_size)')
    parser.add_argument('--gpu-mem', nargs='+', default=['24GiB'], help='memory per device for the '
                        'largest batch, one or more (default: 24GiB; e.g. 80GB, 40GiB)')
    parser.add_argument('--with-cp', action='store_true', help='activation checkpointing in every block')
    parser.add_argument('--bf16', action='store_true', help='bf16 autocast (tools/train.py --amp bf16)')
    parser.add_argument('--measure', action='store_true',
                        help='also measure two real training steps on the CPU (slow for big models)')
    parser.set_defaults(device='cuda')
    args = parser.parse_args(argv)
    if args.device not in ('cuda', 'cpu'):
        parser.error(f'--device must be cuda or cpu (the attention kernels modelled), got {args.device!r}')

    cfg = load_config(args.config, args.cfg_options)
    budgets = [(text, parse_size(text)) for text in args.gpu_mem]
    batch = args.batch or cfg.get('train_dataloader', {}).get('batch_size') or 1
    if batch < 1:
        raise ValueError(f'--batch must be >= 1, got {batch}')
    name = osp.splitext(osp.basename(args.config))[0]
    shape = model_shape(cfg, name)
    with_cp = True if args.with_cp else None
    est = estimate(shape, batch, with_cp=with_cp, bf16=args.bf16, device=args.device)
    cp = shape.with_cp if with_cp is None else with_cp
    print(f'{name}: {shape.params / 1e6:.1f} M parameters, {shape.blocks[0].tokens} tokens, '
          f'{"bf16 autocast" if args.bf16 else "fp32"}, activation checkpointing '
          f'{"on" if cp else "off"}, {shape.optimizer}, modelled for {args.device}')
    rows = [('weights (fp32)', est.weights), ('gradients', est.grads),
            (f'optimizer state ({shape.optimizer})', est.optimizer_state),
            (f'activations, batch {batch}', est.activations),
            (f'peak ({est.peak_phase})', est.peak)]
    width = max(len(r[0]) for r in rows)
    for label, value in rows:
        print(f'  {label:<{width}}  {fmt_bytes(value):>11}')
    for text, budget in budgets:
        fits = largest_batch(shape, budget, with_cp=with_cp, bf16=args.bf16, device=args.device)
        print(f'  largest batch per device within {text}: {fits}')
    for note in shape.notes:
        print(f'  note: {note}')
    if args.measure:
        options = dict(args.cfg_options or {})
        measured = measure(args.config, batch, with_cp=cp, bf16=args.bf16, cfg_options=options)
        cpu = model_shape(cfg, name, backbone_only=shape.detector)
        cpu_est = estimate(cpu, batch, with_cp=cp, bf16=args.bf16, device='cpu')
        err = 100 * (cpu_est.peak - measured['peak']) / measured['peak']
        what = 'backbone ' if shape.detector else ''
        print(f'  CPU {what}training step: measured peak {fmt_bytes(measured["peak"])}, estimate for '
              f'cpu {fmt_bytes(cpu_est.peak)} ({err:+.1f} %)')
