#!/usr/bin/env python
"""Patch-embedding filters of a ViT checkpoint: top principal components as RGB tiles (paper Fig. 7 left).

    python tools/analysis/patch_filters.py CONFIG CHECKPOINT --out filters.png
"""
import os.path as osp
import sys

REPO_ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
if REPO_ROOT not in sys.path:  # run from a checkout without `pip install -e .`
    sys.path.insert(0, REPO_ROOT)

from vit_plugin.analysis.cli import base_parser, run  # noqa: E402


def main(argv=None):
    parser = base_parser(__doc__.splitlines()[0])
    parser.add_argument('--out', default='patch_filters.png', help='output PNG (default: patch_filters.png)')
    parser.add_argument('--num-components', type=int, default=28, help='components to show (default: 28)')
    args = parser.parse_args(argv)
    from vit_plugin.analysis import filters_figure, load_model

    _, vit, _ = load_model(args.config, args.checkpoint, args.device, args.cfg_options)
    path = filters_figure(vit, args.out, args.num_components)
    print(f'wrote {path}')
    return path


if __name__ == '__main__':
    sys.exit(run(main))
