"""Attention rollout from the output token to the input, overlaid on images (paper Fig. 6).

    python tools/analysis/attention_rollout.py CONFIG CHECKPOINT --num-images 8 --out rollout.png
    python tools/analysis/attention_rollout.py CONFIG CHECKPOINT --images a.jpg b.jpg --out rollout.png
"""
from vit_plugin.cli.common import base_parser, image_args
from vit_plugin.evaluation.figure_images import load_images
from vit_plugin.evaluation.figures import rollout_figure
from vit_plugin.evaluation.model_loading import load_model


def main(argv=None):
    parser = base_parser(__doc__.splitlines()[0])
    parser.add_argument('--out', default='attention_rollout.png', help='output PNG')
    image_args(parser, num_images=8)
    parser.add_argument('--head-fusion', default='mean', choices=('mean', 'max', 'min'),
                        help='how heads are combined per layer (default: mean, as Abnar & Zuidema)')
    parser.add_argument('--no-residual', action='store_true',
                        help='do not account for the residual connections (raw attention products)')
    args = parser.parse_args(argv)

    model, vit, cfg = load_model(args.config, args.checkpoint, args.device, args.cfg_options)
    inputs, display = load_images(cfg, model, vit, args.num_images, args.images, args.split, args.device)
    path = rollout_figure(vit, inputs, display, args.out, residual=not args.no_residual,
                          head_fusion=args.head_fusion, max_images=len(inputs))
    print(f'wrote {path}')
    return path
