"""Export a trained classifier (or its ViT backbone) to ONNX, checked against ONNX Runtime.

    python tools/deployment/export_onnx.py CONFIG CHECKPOINT|random [--out model.onnx] [--part classifier|backbone]
        [--img-size 384] [--opset 17] [--atol 1e-4] [--torch-export model.pt2] [--benchmark 20 --batch 8]
        [--backbone-only]

The graph takes RGB float32 pixels in 0..255, (batch, 3, H, W). See docs/inference.md.
"""
import argparse
import json
import os.path as osp
import statistics
import time

import torch

from vit_plugin.checkpoint import CheckpointError, CheckpointMismatchError, is_checkpoint_path
from vit_plugin.compat import mmpretrain as mmpretrain_compat
from vit_plugin.deploy import compile_for_inference
from vit_plugin.export import (ExportWrapper, build_model, export_onnx, export_program, normalization_of,
                               sample_images)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('config')
    parser.add_argument('checkpoint', help="the weights; 'random': the config's initialisation (benchmarks)")
    parser.add_argument('--out', help='ONNX file (default: next to the checkpoint, <name>.onnx)')
    parser.add_argument('--part', choices=['classifier', 'backbone'], default='classifier')
    parser.add_argument('--img-size', type=int, help="export at this resolution (default: the backbone's img_size)")
    parser.add_argument('--opset', type=int, default=17)
    parser.add_argument('--atol', type=float, default=1e-4, help='largest allowed |ONNX Runtime - PyTorch|')
    parser.add_argument('--torch-export', metavar='PATH', help='also save a torch.export program (.pt2)')
    parser.add_argument('--benchmark', type=int, default=0, metavar='ROUNDS', help='time eager / frozen / ORT')
    parser.add_argument('--batch', type=int, default=8, help='benchmark batch size')
    parser.add_argument('--threads', type=int, default=2, help='CPU threads for PyTorch and ONNX Runtime')
    parser.add_argument('--benchmark-out', help='write the benchmark as JSON here')
    parser.add_argument('--backbone-only', action='store_true',
                        help="load only the backbone of CHECKPOINT, on purpose (implied by --part backbone): the head "
                        "keeps untrained weights; otherwise a checkpoint that does not fit the config is refused")
    return parser.parse_args(argv)


def build(args):
    from mmengine.config import Config

    random = args.checkpoint == 'random'
    if not random and not is_checkpoint_path(args.checkpoint):
        raise SystemExit(f'{args.checkpoint}: no such checkpoint file or folder.')
    cfg = Config.fromfile(args.config)
    if args.img_size:
        cfg.model.backbone.img_size = args.img_size
    if cfg.get('test_dataloader', 'absent') is None:  # pre-training configs: get_model would read its dataset
        cfg.pop('test_dataloader')
    try:
        model = build_model(cfg, None if random else args.checkpoint,
                            backbone_only=args.backbone_only or args.part == 'backbone',
                            option='--part backbone (export the backbone alone) or --backbone-only')
    except (CheckpointMismatchError, CheckpointError) as err:
        raise SystemExit(f'ERROR: {err}') from None
    if random:  # for timing only: the config's initialisation, no checkpoint
        print('CHECKPOINT is "random": the weights are the config\'s initialisation (for benchmarks).')
    size = getattr(model.backbone, 'img_size', None)
    if size is None:
        raise SystemExit(f'{args.config}: the backbone has no img_size; export needs a fixed resolution.')
    return model, (tuple(size) if isinstance(size, (tuple, list)) else (size, size))


def benchmark(wrapper, onnx_path, img_size, args) -> dict:
    """Median seconds per batch of eager, frozen-compiled and ONNX Runtime, timed in turns."""
    import onnxruntime as ort

    torch.set_num_threads(args.threads)
    options = ort.SessionOptions()
    options.intra_op_num_threads = args.threads
    session = ort.InferenceSession(onnx_path, options, providers=['CPUExecutionProvider'])
    images = sample_images(args.batch, img_size)
    numpy_images = images.numpy()
    frozen = compile_for_inference(wrapper)

    def eager():
        with torch.inference_mode():
            wrapper(images)

    runners = {'eager PyTorch': eager, 'frozen compiled (vit_plugin.deploy)': lambda: frozen(images),
               'ONNX Runtime': lambda: session.run(None, {'images': numpy_images})}
    for run in runners.values():  # warm-up; the frozen model compiles here
        run(), run()
    times = {name: [] for name in runners}
    for _ in range(args.benchmark):
        for name, run in runners.items():
            start = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - start)
    medians = {name: statistics.median(t) for name, t in times.items()}
    ort_median = medians['ONNX Runtime']
    print(f'\nCPU latency, batch {args.batch}, {img_size[0]}x{img_size[1]}, {args.threads} threads, '
          f'median of {args.benchmark} interleaved rounds:')
    for name, median in medians.items():
        print(f'  {name:<38} {median * 1e3:9.1f} ms  ({args.batch / median:7.1f} img/s)  '
              f'time vs ONNX Runtime: {median / ort_median:.2f}x')
    return dict(batch=args.batch, img_size=list(img_size), threads=args.threads, rounds=args.benchmark,
                median_s=medians, times_s=times)


def main(argv=None):
    args = parse_args(argv)
    model, img_size = build(args)
    mean, std = normalization_of(model)
    wrapper = ExportWrapper(model, mean, std, part=args.part).eval()
    if args.out is None and args.checkpoint == 'random':
        raise SystemExit('give --out with CHECKPOINT random')
    # a hub id or a model folder has no file name to put the output next to: the working directory gets it
    stem = (args.checkpoint.split('/')[-1].split('@')[0] if args.checkpoint.startswith('hf-hub:')
            else osp.splitext(args.checkpoint.rstrip('/'))[0])
    out = args.out or stem + ('' if args.part == 'classifier' else '_backbone') + '.onnx'
    classes = (mmpretrain_compat.dataset_meta(model) or {}).get('classes')  # set by mmpretrain's get_model
    meta = dict(config=osp.basename(args.config), checkpoint=osp.basename(args.checkpoint), part=args.part)
    if classes:
        meta['classes'] = json.dumps(list(classes))
    diffs = export_onnx(wrapper, out, img_size, opset=args.opset, atol=args.atol, metadata=meta)
    print(f'{out}: {args.part} at {img_size[0]}x{img_size[1]}, dynamic batch; ONNX Runtime vs PyTorch, largest '
          f'|difference|: ' + ', '.join(f'batch {b}: {d:.1e}' for b, d in diffs.items()))
    result = dict(onnx=out, max_abs_diff=diffs)
    if args.torch_export:
        diff = export_program(wrapper, args.torch_export, img_size)
        print(f'{args.torch_export}: torch.export program, dynamic batch; |exported - eager| {diff:.1e}')
        result['torch_export_max_abs_diff'] = diff
    if args.benchmark:
        result['benchmark'] = benchmark(wrapper, out, img_size, args)
        if args.benchmark_out:
            with open(args.benchmark_out, 'w') as f:
                json.dump(result['benchmark'], f, indent=1)
    return result
