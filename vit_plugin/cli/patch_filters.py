"""Patch-embedding filters of a ViT checkpoint: top principal components as RGB tiles (paper Fig. 7 left).

    python tools/analysis/patch_filters.py CONFIG CHECKPOINT --out filters.png
"""
from vit_plugin.cli.common import base_parser
from vit_plugin.evaluation.figures import filters_figure
from vit_plugin.evaluation.model_loading import load_model


def main(argv=None):
    parser = base_parser(__doc__.splitlines()[0])
    parser.add_argument('--out', default='patch_filters.png', help='output PNG (default: patch_filters.png)')
    parser.add_argument('--num-components', type=int, default=28, help='components to show (default: 28)')
    args = parser.parse_args(argv)

    _, vit, _ = load_model(args.config, args.checkpoint, args.device, args.cfg_options)
    path = filters_figure(vit, args.out, args.num_components)
    print(f'wrote {path}')
    return path
