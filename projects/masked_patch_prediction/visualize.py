"""Show what an MPP model predicts for the corrupted patches of a few test digits.

Each row is one test image: the original; the encoder's input (patches replaced by [mask] in grey,
by a random other patch outlined in blue, kept-but-predicted outlined in green); the target of every
corrupted patch (3-bit mean colour, 4x4 3-bit cells or pixels, depending on the model's target); the
model's prediction for it. Clean patches are shown as they are in the last two columns::

    python projects/masked_patch_prediction/visualize.py work_dirs/mpp_experiment/mpp/iter_300.pth \
        --out work_dirs/mpp_experiment/predictions.png
"""
import argparse
import os.path as osp

import numpy as np
import torch

HERE = osp.dirname(osp.abspath(__file__))
ROOT = osp.dirname(osp.dirname(HERE))


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('checkpoint', help='an MPP runner checkpoint of configs/mpp_tiny-vit_digits.py')
    parser.add_argument('--config', default=osp.join(HERE, 'configs', 'mpp_tiny-vit_digits.py'))
    parser.add_argument('--data-root', default=osp.join(ROOT, 'data', 'digits'))
    parser.add_argument('--num', type=int, default=6, help='number of test images (one per class)')
    parser.add_argument('--seed', type=int, default=0, help='seed of the corruption draw')
    parser.add_argument('--out', default='mpp_predictions.png')
    return parser.parse_args()


def patch_pixels(values: torch.Tensor, kind: str, patch_size, channels: int = 3, bits: int = 3) -> torch.Tensor:
    """A target or prediction of one kind -> pixels (..., ph, pw, C) in [0, 255] for display.

    Classification outputs (logits, last dim = classes) are reduced with argmax first.
    """
    from vit_plugin.models.selfsup.targets import class_to_color, pixels_from_pixel_target
    ph, pw = patch_size
    if kind == 'pixel_l2':
        return pixels_from_pixel_target(values, patch_size, channels)
    colors = class_to_color(values, bits, channels)  # mean colour (..., C) or cells (..., cells**2, C)
    if kind == 'mean_color_3bit':
        return colors[..., None, None, :].expand(*colors.shape[:-1], ph, pw, channels)
    cells = int(round(colors.shape[-2]**0.5))
    grid = colors.reshape(*colors.shape[:-2], cells, cells, channels)
    return grid.repeat_interleave(ph // cells, dim=-3).repeat_interleave(pw // cells, dim=-2)


def main():
    args = parse_args()
    render(args.checkpoint, args.out, config=args.config, data_root=args.data_root, num=args.num, seed=args.seed)


def render(checkpoint, out_path, config=osp.join(HERE, 'configs', 'mpp_tiny-vit_digits.py'),
           data_root=osp.join(ROOT, 'data', 'digits'), num=6, seed=0):
    """Draw the prediction picture of an MPP checkpoint into ``out_path`` (PNG)."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle
    from mmengine.config import Config
    from mmengine.registry import init_default_scope
    from mmengine.runner import load_checkpoint
    from mmpretrain.registry import MODELS
    from PIL import Image

    import vit_plugin  # noqa: F401
    from vit_plugin.datasets.digits import prepare_digits_dataset
    from vit_plugin.models.selfsup.corruption import ACTION_KEEP, ACTION_MASK, ACTION_RANDOM, sample_corruption

    init_default_scope('mmpretrain')
    cfg = Config.fromfile(config)
    model = MODELS.build(cfg.model)
    load_checkpoint(model, checkpoint, map_location='cpu', logger='silent')
    model.eval()
    prepare_digits_dataset(data_root, img_size=32)

    paths = [sorted(glob_split(data_root, cls))[0] for cls in range(num)]
    bgr = torch.from_numpy(np.stack([np.asarray(Image.open(p).convert('RGB'))[..., ::-1].copy() for p in paths]))
    inputs = model.data_preprocessor(dict(inputs=bgr.permute(0, 3, 1, 2), data_samples=None))['inputs']
    B = inputs.shape[0]
    ph, pw = model.backbone.patch_size
    h, w = inputs.shape[2] // ph, inputs.shape[3] // pw
    plan = sample_corruption(B, h * w, model.corrupt_ratio, model.mask_prob, model.random_prob, model.random_source,
                             generator=torch.Generator().manual_seed(seed))
    out = model.predict_corrupted(inputs, plan)
    kind = model.head.target
    pred = out['pred'].argmax(-1) if model.head.is_classification else out['pred']
    pred_px = patch_pixels(pred, kind, (ph, pw))
    target_px = patch_pixels(out['target'], kind, (ph, pw))
    pixels = out['pixels'].permute(0, 2, 3, 1)  # (B, H, W, C)

    def to_patches(img):  # (H, W, C) -> (N, ph, pw, C)
        return img.reshape(h, ph, w, pw, -1).permute(0, 2, 1, 3, 4).reshape(h * w, ph, pw, -1)

    def from_patches(patches):
        return patches.reshape(h, w, ph, pw, -1).permute(0, 2, 1, 3, 4).reshape(h * ph, w * pw, -1)

    fig, axes = plt.subplots(B, 4, figsize=(7, 1.8 * B))
    for b in range(B):
        original = to_patches(pixels[b])
        shown_input, shown_target, shown_pred = original.clone(), original.clone(), original.clone()
        flat = torch.cat([to_patches(pixels[i]) for i in range(B)])
        for k in range(plan.ids.shape[1]):
            n, action = int(plan.ids[b, k]), int(plan.actions[b, k])
            if action == ACTION_MASK:
                shown_input[n] = 128.
            elif action == ACTION_RANDOM:
                shown_input[n] = flat[int(plan.sources[b, k])]
            shown_target[n], shown_pred[n] = target_px[b, k], pred_px[b, k]
        for col, (img, title) in enumerate(((original, 'image'), (shown_input, 'encoder input'),
                                            (shown_target, f'target ({kind})'), (shown_pred, 'prediction'))):
            ax = axes[b, col]
            ax.imshow(from_patches(img).clamp(0, 255).byte().numpy(), interpolation='nearest')
            ax.set_xticks([])
            ax.set_yticks([])
            if b == 0:
                ax.set_title(title, fontsize=8)
            for k in range(plan.ids.shape[1]):
                n, action = int(plan.ids[b, k]), int(plan.actions[b, k])
                color = {ACTION_MASK: 'red', ACTION_RANDOM: 'blue', ACTION_KEEP: 'green'}[action]
                r, c = divmod(n, w)
                ax.add_patch(Rectangle((c * pw - .5, r * ph - .5), pw, ph, fill=False, lw=1, ec=color))
    fig.suptitle('MPP on test digits (red: [mask], blue: random other patch, green: kept)', fontsize=8)
    fig.tight_layout()
    fig.savefig(out_path, dpi=110)
    plt.close(fig)


def glob_split(data_root, cls, split='test'):
    import glob
    return glob.glob(osp.join(data_root, split, str(cls), '*.png'))


if __name__ == '__main__':
    main()
