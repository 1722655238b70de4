"""Plan training memory: weights, gradients, optimizer state, activations, the largest batch that fits.

    python tools/analysis/memory.py CONFIG [--batch N] [--gpu-mem 24GiB [80GiB ...]] [--with-cp] [--bf16]
        [--device {cuda,cpu}] [--measure] [--cfg-options KEY=VALUE ...]

The estimate is analytic (vit_plugin/analysis/memory.py): the config's model is built on the meta
device for its parameter counts and block shapes, and the tensors autograd keeps are added up per
encoder block. --measure also runs two real training steps on this machine's CPU (in a child
process) and prints their peak memory next to the estimate. See docs/memory.md.
"""
import os.path as osp


from vit_plugin.analysis.cli import base_parser
from vit_plugin.analysis.loading import load_config
from vit_plugin.analysis.memory import estimate, fmt_bytes, largest_batch, model_shape, parse_size
from vit_plugin.analysis.memory_measure import measure


def main(argv=None):
    parser = base_parser(__doc__.splitlines()[0], with_model=False)
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
