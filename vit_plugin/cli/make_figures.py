"""All figures of one checkpoint into one directory (the gallery in docs/evaluation.md is made with it).

    python tools/analysis/make_figures.py CONFIG CHECKPOINT --out-dir docs/figures

Writes patch_filters.png, pos_embed_similarity.png, attention_distance.png (+ .json),
attention_rollout.png and model_summary.png (+ .md, with a row for the config's model).
"""
import json
import os
import os.path as osp

from vit_plugin.cli.common import base_parser, image_args
from vit_plugin.evaluation import figures
from vit_plugin.evaluation.figure_images import load_images
from vit_plugin.evaluation.model_complexity import config_row, format_markdown, summary_rows
from vit_plugin.evaluation.model_loading import load_model
from vit_plugin.models.vit_search import WrongModelError


def main(argv=None):
    parser = base_parser(__doc__.splitlines()[0])
    parser.add_argument('--out-dir', default='figures', help='output directory (default: figures)')
    image_args(parser, num_images=128)
    parser.add_argument('--rollout-images', type=int, default=8, help='images in the rollout figure (default: 8)')
    args = parser.parse_args(argv)

    model, vit, cfg = load_model(args.config, args.checkpoint, args.device, args.cfg_options)
    os.makedirs(args.out_dir, exist_ok=True)
    out = lambda name: osp.join(args.out_dir, name)  # noqa: E731
    written = [figures.pos_embed_figure(vit, out('pos_embed_similarity.png'))]
    try:
        written.append(figures.filters_figure(vit, out('patch_filters.png')))
    except WrongModelError as err:  # a hybrid has no pixel filters; the other figures still apply
        print(f'skipped patch filters: {err}')
    inputs, display = load_images(cfg, model, vit, args.num_images, args.images, args.split, args.device)
    path, dist = figures.attention_distance_figure(vit, inputs, out('attention_distance.png'))
    with open(out('attention_distance.json'), 'w') as f:
        json.dump(dict(num_images=len(inputs), image_size=list(inputs.shape[-2:]),
                       mean_distance_px=[[round(float(v), 3) for v in layer] for layer in dist]), f, indent=1)
    written.append(path)
    written.append(figures.rollout_figure(vit, inputs, display, out('attention_rollout.png'),
                                    max_images=args.rollout_images))
    rows = summary_rows() + [config_row(osp.splitext(osp.basename(args.config))[0], vit, model)]
    written.append(figures.summary_figure(out('model_summary.png'), rows)[0])
    with open(out('model_summary.md'), 'w') as f:
        f.write(format_markdown(rows) + '\n')
    for path in written:
        print(f'wrote {path}')
    return written
