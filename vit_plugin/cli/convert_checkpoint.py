"""Convert a ViT checkpoint (official JAX .npz, timm, mmpretrain) into a vit_plugin .pth (or export
ours to timm/mmpretrain).

    python tools/convert_checkpoint.py SRC DST [--arch b] [--num-classes 10] [--img-size 384]
        [--src-format timm] [--dst-format timm|mmpretrain|transformers] [--head-label-space A:B]

Examples and every option: docs/checkpoints.md#converting-files.
"""
import argparse
import sys


from vit_plugin.checkpoint import CheckpointError, CheckpointFormatError, HubCheckpointError
from vit_plugin.converters import ConversionError
from vit_plugin.converters.convert_file import DST_FORMATS, SRC_FORMATS, convert_checkpoint_file
from vit_plugin.converters.head_label_space import parse_label_space_pair
from vit_plugin.models.pos_embed import RESIZE_MODES


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('src', help='source checkpoint: a file (official JAX .npz, PyTorch, safetensors; told by '
                                    'its content), a model folder (config.json + model.safetensors) or '
                                    'hf-hub:<org>/<name>[@revision]')
    parser.add_argument('dst', help='output .pth, or .safetensors (written atomically); with --dst-format '
                                    'transformers, a folder (model.safetensors + config.json)')
    parser.add_argument('--src-format', default='auto', choices=SRC_FORMATS,
                        help='source layout (mmpretrain_mim: an MAE/MaskFeat training checkpoint); auto: npz content -> '
                             'jax, otherwise detected from the key names')
    parser.add_argument('--dst-format', default='vit_plugin', choices=DST_FORMATS,
                        help='output layout (default: ours, backbone.* + head.layers.*)')
    parser.add_argument('--arch', help='fail unless the weights are of this ViT arch (ti, s, b, l, h, ...)')
    parser.add_argument('--num-heads', type=int,
                        help='--dst-format transformers: attention heads, when neither --arch nor the source says')
    parser.add_argument('--backbone-only', action='store_true',
                        help='write bare backbone keys (for init_cfg without prefix); the head is dropped')
    parser.add_argument('--num-classes', type=int,
                        help='fine-tuning transfer: drop the head (and pre_logits), add a zero head of this size')
    parser.add_argument('--keep-pre-logits', action='store_true', help='with --num-classes: keep pre_logits')
    parser.add_argument('--img-size', type=int, nargs='+', metavar='PX',
                        help='resize the position embedding for this input size (H [W])')
    parser.add_argument('--patch-size', type=int, nargs='+', metavar='P',
                        help='resize the patch-embedding kernel to this patch size (FlexiViT pseudo-inverse); '
                             'the grid follows (at --img-size, or the trained resolution)')
    parser.add_argument('--pos-embed-grid', type=int, nargs=2, metavar=('ROWS', 'COLS'),
                        help='grid of a non-square position embedding (cannot be inferred)')
    parser.add_argument('--pos-embed-mode', choices=RESIZE_MODES,
                        help='resize mode used now and recorded for later loads (default: the mode the '
                             'source records, official for .npz sources; else official, the paper\'s resize)')
    parser.add_argument('--head-label-space', metavar='SRC:DST',
                        help='reorder the classifier rows from one label space to another, e.g. google21k:fall11 '
                             '(official in21k head -> timm 22k shards); classes DST lacks are dropped, classes SRC '
                             'lacks get zero rows (names: fall11, google21k, winter21, imagenet1k, or aliases)')
    parser.add_argument('--allow-unknown', action='store_true', help='drop source keys that are not understood')
    parser.add_argument('--allow-missing', action='store_true', help='accept sources that lack model weights')
    parser.add_argument('--no-progress', action='store_true', help='no progress bar (shown for files over 64 MiB)')
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    img_size = None
    if args.img_size:
        if len(args.img_size) > 2:
            print('error: --img-size takes H or H W', file=sys.stderr)
            return 2
        img_size = tuple(args.img_size) if len(args.img_size) == 2 else args.img_size[0]
    patch_size = None
    if args.patch_size:
        if len(args.patch_size) > 2:
            print('error: --patch-size takes P or PH PW', file=sys.stderr)
            return 2
        patch_size = tuple(args.patch_size) if len(args.patch_size) == 2 else args.patch_size[0]
    try:
        head_label_space = None if args.head_label_space is None else parse_label_space_pair(args.head_label_space)
        report, meta = convert_checkpoint_file(
            args.src, args.dst, src_format=args.src_format, dst_format=args.dst_format, arch=args.arch,
            backbone_only=args.backbone_only, num_classes=args.num_classes, keep_pre_logits=args.keep_pre_logits,
            img_size=img_size, patch_size=patch_size, pos_embed_grid=args.pos_embed_grid, pos_embed_mode=args.pos_embed_mode,
            allow_unknown=args.allow_unknown, allow_missing=args.allow_missing, show_progress=not args.no_progress,
            num_heads=args.num_heads, head_label_space=head_label_space)
    except (ConversionError, CheckpointError, CheckpointFormatError, HubCheckpointError, FileNotFoundError,
            ValueError) as err:
        print(f'error: {err}', file=sys.stderr)
        print(f'nothing was written to {args.dst}', file=sys.stderr)
        return 1
    print(report.summary())
    if 'model_cfg' in meta:
        print(f'backbone config for these weights: {meta["model_cfg"]}')
    print(f'wrote {args.dst}')
    return 0
