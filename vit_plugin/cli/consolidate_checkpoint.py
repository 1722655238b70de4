"""Turn a sharded checkpoint (the ``iter_N.pth/`` directories of ``tools/train.py --fsdp``) into one
ordinary checkpoint file, for ``tools/test.py``, fine-tuning (``load_from`` / ``init_cfg``) and
``tools/convert_checkpoint.py``.

    python tools/consolidate_checkpoint.py work_dirs/RUN/iter_N.pth [OUT.pth]

OUT defaults to ``<RUN>/iter_N_consolidated.pth``. One process and no GPU are needed. The optimizer
state is not included: continue a run with ``--resume`` from the sharded directory itself.
"""
import argparse
import os.path as osp

from vit_plugin.engine.fsdp2 import consolidate_sharded_checkpoint


def main(argv=None):
    parser = argparse.ArgumentParser(description='Consolidate a sharded (FSDP2/DCP) checkpoint into one file.')
    parser.add_argument('src', help='sharded checkpoint directory (e.g. work_dirs/RUN/iter_N.pth)')
    parser.add_argument('dst', nargs='?', help='output file (default: <src without .pth>_consolidated.pth)')
    args = parser.parse_args(argv)

    src = osp.normpath(args.src)
    dst = args.dst or (src[:-4] if src.endswith('.pth') else src) + '_consolidated.pth'
    try:
        checkpoint = consolidate_sharded_checkpoint(src, dst)
    except ValueError as err:
        raise SystemExit(f'ERROR: {err}') from None
    count = sum(t.numel() for t in checkpoint['state_dict'].values())
    print(f'{dst}: {len(checkpoint["state_dict"])} tensors, {count:,} values '
          f'(iteration {checkpoint["meta"].get("iter")})')
    return dst
