"""Images per second of JPEG training input pipelines (Inception crop + flip) on one CPU core.

The data are realistic JPEGs made from scikit-learn's two bundled photos (640x427; matplotlib's
sample photo where scikit-learn is missing): random cuts, resized to ImageNet-like sizes
(``--long-side`` x 3/4 of it, a quarter of them portrait) and encoded
at quality 90, seeded, in a temporary folder. Timed in this process with one torch and one OpenCV
thread, from the file path to the packed CHW uint8 tensor:

* ``mmpretrain_vit``: mmpretrain 1.2's ViT-B/16 ImageNet training pipeline
  (``vision_transformer/vit-base-p16_64xb64_in1k.py``): ``LoadImageFromFile``,
  ``RandomResizedCrop(224, backend='pillow', interpolation='bicubic')``, ``RandomFlip``,
  ``PackInputs`` (its ``AutoAugment`` step is left out: it is no part of the crop pipeline).
* ``mmpretrain_cv2``: the same mmpretrain transforms with the cv2 backend (bilinear) and the paper's
  crop range (0.05, 1).
* ``torchvision``: PIL decode, ``RandomResizedCrop(224, scale=(0.05, 1))``,
  ``RandomHorizontalFlip``, ``PILToTensor``.
* ``ours``: ``vit_plugin.LoadAndInceptionCrop(224, crop_ratio_range=(0.05, 1))``, ``RandomFlip``,
  ``PackInputs``.

Every repeat runs each pipeline once over all files, in turns, so that load from other processes
hits all of them alike; the median over repeats is reported, and "ours vs X" is the median of the
per-repeat ratios (paired). A decode-only table (full-resolution decode to a BGR/RGB array) shows the
decoders the choice of ours was made from; simplejpeg is timed when it is installed.

Example::

    python tools/analysis/benchmark_pipeline.py --num-images 200 --repeats 7 \
        --out work_dirs/benchmark/pipeline_cpu.json
"""
import argparse
import io
import os
import os.path as osp
import platform
import statistics
import tempfile
from typing import Callable, Dict, List

import cv2
import numpy as np
import torch

from benchmarks.results import write_result
from benchmarks.timing import paired_rounds

PIPELINES = ('mmpretrain_vit', 'mmpretrain_cv2', 'torchvision', 'ours')


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--num-images', type=int, default=128, help='JPEG files made. Default: 128.')
    parser.add_argument('--long-side', type=int, default=500,
                        help='long side of the files in px (short side 3/4 of it). Default: 500.')
    parser.add_argument('--quality', type=int, default=90, help='JPEG quality. Default: 90.')
    parser.add_argument('--size', type=int, default=224, help='output crop size. Default: 224.')
    parser.add_argument('--repeats', type=int, default=7, help='timed passes per pipeline (median). Default: 7.')
    parser.add_argument('--warmup', type=int, default=1, help='untimed passes per pipeline. Default: 1.')
    parser.add_argument('--pipelines', nargs='+', default=list(PIPELINES), choices=PIPELINES)
    parser.add_argument('--seed', type=int, default=0)
    parser.add_argument('--out', default='work_dirs/benchmark/pipeline.json', help='JSON output path.')
    return parser.parse_args(argv)


def sample_photos() -> List[np.ndarray]:
    """BGR photos to cut the JPEGs from: scikit-learn's two sample photos (640x427), or matplotlib's
    sample photo (512x600) where scikit-learn is not installed (e.g. a venv made from the wheelhouse)."""
    try:
        from sklearn.datasets import load_sample_images
    except ImportError:
        from matplotlib import cbook
        with cbook.get_sample_data('grace_hopper.jpg') as f:
            photo = cv2.imdecode(np.frombuffer(f.read(), np.uint8), cv2.IMREAD_COLOR)
        return [photo, np.ascontiguousarray(photo[:, ::-1])]
    return [img[:, :, ::-1] for img in load_sample_images().images]  # RGB -> BGR for cv2


def make_jpegs(folder: str, num: int, long_side: int, quality: int, seed: int) -> List[str]:
    """Write ``num`` JPEGs cut from sample photos (:func:`sample_photos`); returns their paths."""
    photos = sample_photos()
    rng = np.random.default_rng(seed)
    short = int(round(long_side * 3 / 4))
    paths = []
    for i in range(num):
        photo = photos[i % len(photos)]
        ph, pw = photo.shape[:2]
        portrait = rng.random() < 0.25
        # A random cut of 40-100 % of each side, resized to the target size: varied content and
        # scale, like photos of different framing.
        ch, cw = int(ph * rng.uniform(0.4, 1)), int(pw * rng.uniform(0.4, 1))
        y, x = rng.integers(0, ph - ch + 1), rng.integers(0, pw - cw + 1)
        size = (short, long_side) if portrait else (long_side, short)  # (w, h) for cv2
        interp = cv2.INTER_AREA if size[0] * size[1] < ch * cw else cv2.INTER_CUBIC
        img = cv2.resize(np.ascontiguousarray(photo[y:y + ch, x:x + cw]), size, interpolation=interp)
        path = osp.join(folder, f'{i:05d}.jpg')
        if not cv2.imwrite(path, img, [cv2.IMWRITE_JPEG_QUALITY, quality]):
            raise OSError(f'cannot write {path}')
        paths.append(path)
    return paths


def build_pipelines(names, size: int) -> Dict[str, Callable[[str], object]]:
    """Callables from a file path to the packed image, one per name."""
    from mmengine.dataset import Compose
    from mmengine.registry import init_default_scope
    from torchvision import transforms as T
    from PIL import Image

    init_default_scope('mmpretrain')
    flip_pack = [dict(type='RandomFlip', prob=0.5, direction='horizontal'), dict(type='PackInputs')]
    configs = {
        'mmpretrain_vit': [dict(type='LoadImageFromFile'),
                           dict(type='RandomResizedCrop', scale=size, backend='pillow', interpolation='bicubic')],
        'mmpretrain_cv2': [dict(type='LoadImageFromFile'),
                           dict(type='RandomResizedCrop', scale=size, crop_ratio_range=(0.05, 1.0))],
        'ours': [dict(type='vit_plugin.LoadAndInceptionCrop', scale=size, crop_ratio_range=(0.05, 1.0))],
    }
    out = {}
    for name in names:
        if name == 'torchvision':
            tv = T.Compose([T.RandomResizedCrop(size, scale=(0.05, 1.0)), T.RandomHorizontalFlip(),
                            T.PILToTensor()])

            def run_tv(path, tv=tv):
                with Image.open(path) as im:  # what torchvision's ImageFolder loader does
                    return tv(im.convert('RGB'))
            out[name] = run_tv
        else:
            pipeline = Compose(configs[name] + flip_pack)
            out[name] = lambda path, pipeline=pipeline: pipeline(dict(img_path=path))
    return out


def decoders() -> Dict[str, Callable[[bytes], object]]:
    """Full-resolution decoders of JPEG bytes to an HxWx3 array (or tensor)."""
    from PIL import Image
    from torchvision.io import ImageReadMode, decode_jpeg
    found = {
        'cv2.imdecode': lambda b: cv2.imdecode(np.frombuffer(b, np.uint8), cv2.IMREAD_COLOR),
        'pillow': lambda b: np.asarray(Image.open(io.BytesIO(b)).convert('RGB')),
        'torchvision.io': lambda b: decode_jpeg(torch.frombuffer(bytearray(b), dtype=torch.uint8),
                                                mode=ImageReadMode.RGB),
    }
    try:
        import simplejpeg
        found['simplejpeg'] = lambda b: simplejpeg.decode_jpeg(b, colorspace='BGR')
    except ImportError:  # an optional comparison only
        pass
    return found


def time_rounds(funcs: Dict[str, Callable], items: list, repeats: int, warmup: int) -> Dict[str, List[float]]:
    """Seconds per item of each function, one list entry per repeat; the functions take turns, each
    over all items."""
    def over_items(func):
        def one_pass():
            for item in items:
                func(item)
        return one_pass

    times = paired_rounds({name: over_items(func) for name, func in funcs.items()}, repeats, warmup=warmup)
    return {name: [t / len(items) for t in ts] for name, ts in times.items()}


def summarise(times: Dict[str, List[float]], reference: str = None) -> Dict[str, dict]:
    rows = {}
    for name, ts in times.items():
        row = dict(images_per_s=1.0 / statistics.median(ts), ms_per_image=1e3 * statistics.median(ts),
                   repeats=len(ts))
        if reference in times and name != reference:
            # Paired per-repeat ratios: ours' speed-up over this pipeline.
            row[f'{reference}_speedup'] = statistics.median(t / r for t, r in zip(ts, times[reference]))
        rows[name] = row
    return rows


def main(argv=None) -> dict:
    args = parse_args(argv)
    torch.set_num_threads(1)
    cv2.setNumThreads(1)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    with tempfile.TemporaryDirectory(prefix='jpegs_') as folder:
        paths = make_jpegs(folder, args.num_images, args.long_side, args.quality, args.seed)
        mean_kb = sum(os.path.getsize(p) for p in paths) / len(paths) / 1024
        blobs = []
        for p in paths:
            with open(p, 'rb') as f:
                blobs.append(f.read())
        decode_times = time_rounds(decoders(), blobs, args.repeats, args.warmup)
        pipe_times = time_rounds(build_pipelines(args.pipelines, args.size), paths, args.repeats, args.warmup)
    result = dict(
        setting=dict(num_images=args.num_images, long_side=args.long_side, quality=args.quality,
                     mean_file_kb=round(mean_kb, 1), size=args.size, repeats=args.repeats, threads=1,
                     cpu=platform.processor() or platform.machine(), python=platform.python_version(),
                     torch=torch.__version__, opencv=cv2.__version__),
        pipelines=summarise(pipe_times, 'ours'),
        decoders=summarise(decode_times, 'cv2.imdecode'),
    )
    print(f"{args.num_images} JPEGs of {args.long_side}x{int(round(args.long_side * 3 / 4))} "
          f"(quality {args.quality}, {mean_kb:.0f} KiB on average), one core, median of {args.repeats}")
    print(f"{'pipeline':16s} {'images/s':>9s} {'ms/image':>9s} {'ours vs it':>11s}")
    for name, row in result['pipelines'].items():
        ratio = f"{row['ours_speedup']:.2f}x" if 'ours_speedup' in row else ''
        print(f"{name:16s} {row['images_per_s']:9.0f} {row['ms_per_image']:9.3f} {ratio:>11s}")
    print(f"{'decoder (full)':16s} {'images/s':>9s} {'ms/image':>9s} {'cv2 vs it':>11s}")
    for name, row in result['decoders'].items():
        ratio = f"{row['cv2.imdecode_speedup']:.2f}x" if 'cv2.imdecode_speedup' in row else ''
        print(f"{name:16s} {row['images_per_s']:9.0f} {row['ms_per_image']:9.3f} {ratio:>11s}")
    if args.out:
        write_result(result, args.out, indent=2)
        print(f'written {args.out}')
    return result
