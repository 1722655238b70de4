"""Mean attention distance per head versus depth over a set of images (paper Fig. 7 right).

    python tools/analysis/attention_distance.py CONFIG CHECKPOINT --num-images 128 --out distance.png

Images come from the config's test dataloader (or --images FILE ...). The per-layer, per-head values
(pixels) are printed and saved next to the PNG as JSON.
"""
import json
import os.path as osp

from vit_plugin.cli.common import base_parser, image_args
from vit_plugin.evaluation.figure_images import load_images
from vit_plugin.evaluation.figures import attention_distance_figure
from vit_plugin.evaluation.model_loading import load_model


def main(argv=None):
    parser = base_parser(__doc__.splitlines()[0])
    parser.add_argument('--out', default='attention_distance.png', help='output PNG')
    image_args(parser, num_images=128)
    args = parser.parse_args(argv)

    model, vit, cfg = load_model(args.config, args.checkpoint, args.device, args.cfg_options)
    inputs, _ = load_images(cfg, model, vit, args.num_images, args.images, args.split, args.device)
    path, dist = attention_distance_figure(vit, inputs, args.out)
    values = [[round(float(v), 3) for v in layer] for layer in dist]
    with open(osp.splitext(args.out)[0] + '.json', 'w') as f:
        json.dump(dict(num_images=len(inputs), image_size=list(inputs.shape[-2:]), mean_distance_px=values), f,
                  indent=1)
    for depth, layer in enumerate(values, 1):
        print(f'layer {depth:2d}: ' + ' '.join(f'{v:6.2f}' for v in layer))
    print(f'wrote {path}')
    return path
