"""Position-embedding similarity of a ViT checkpoint: each patch's cosine similarity to all others (Fig. 7 centre).

    python tools/analysis/pos_embed_similarity.py CONFIG CHECKPOINT --out pos_embed.png
"""
from vit_plugin.cli.common import base_parser
from vit_plugin.evaluation.figures import pos_embed_figure
from vit_plugin.evaluation.model_loading import load_model


def main(argv=None):
    parser = base_parser(__doc__.splitlines()[0])
    parser.add_argument('--out', default='pos_embed_similarity.png', help='output PNG')
    args = parser.parse_args(argv)

    _, vit, _ = load_model(args.config, args.checkpoint, args.device, args.cfg_options)
    path = pos_embed_figure(vit, args.out)
    print(f'wrote {path}')
    return path
