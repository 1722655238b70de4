"""Parameters and FLOPs of the paper's ViT models per patch size and resolution, next to its Table 1.

    python tools/analysis/model_summary.py --out model_summary.png
    python tools/analysis/model_summary.py --config CONFIG [--checkpoint CHECKPOINT] --out summary.png

Standard models are counted in closed form (1000-class head, FLOPs = multiply-adds); a --config adds
a row measured on the model it builds (with --checkpoint, after checking that the weights fit it).
"""
import os.path as osp

from vit_plugin.cli.common import base_parser
from vit_plugin.evaluation.figures import summary_figure
from vit_plugin.evaluation.model_complexity import config_row, format_markdown, summary_rows
from vit_plugin.evaluation.model_loading import load_model


def main(argv=None):
    parser = base_parser(__doc__.splitlines()[0], with_model=False)
    parser.add_argument('--config', default=None, help='also measure the model of this config')
    parser.add_argument('--checkpoint', default=None, help='checkpoint to verify against --config')
    parser.add_argument('--resolutions', type=int, nargs='+', default=[224, 384], help='(default: 224 384)')
    parser.add_argument('--out', default='model_summary.png', help='output PNG; a .md table is written next to it')
    args = parser.parse_args(argv)

    if args.checkpoint and not args.config:
        parser.error('--checkpoint needs --config (the model it belongs to)')
    rows = summary_rows(resolutions=args.resolutions)
    if args.config:
        model, vit, _ = load_model(args.config, args.checkpoint, args.device, args.cfg_options)
        rows.append(config_row(osp.splitext(osp.basename(args.config))[0], vit, model))
    path, rows = summary_figure(args.out, rows)
    table = format_markdown(rows)
    with open(osp.splitext(args.out)[0] + '.md', 'w') as f:
        f.write(table + '\n')
    print(table)
    print(f'wrote {path}')
    return path
