"""A small digits dataset for the MPP study's end-to-end scripts (projects/masked_patch_prediction): the
first images of every class of each split of the demo dataset, in its folder layout, with its
``meta.json`` (the mark of a complete preparation, which the scripts then use as it is)."""
import json
import os
import os.path as osp
import shutil


def digits_subset(src_root: str, dst_root: str, train_per_class: int = 16, test_per_class: int = 5) -> str:
    """Copy ``train_per_class`` / ``test_per_class`` images of every class of the digits at ``src_root``
    (``vit_plugin.datasets.digits.prepare_digits_dataset``) to ``dst_root``. Returns ``dst_root``."""
    counts = {}
    for split, per_class in (('train', train_per_class), ('test', test_per_class)):
        counts[split] = 0
        for cls in sorted(os.listdir(osp.join(src_root, split))):
            os.makedirs(osp.join(dst_root, split, cls))
            for name in sorted(os.listdir(osp.join(src_root, split, cls)))[:per_class]:
                shutil.copyfile(osp.join(src_root, split, cls, name), osp.join(dst_root, split, cls, name))
                counts[split] += 1
    with open(osp.join(src_root, 'meta.json')) as f:
        meta = json.load(f)
    meta.update(num_train=counts['train'], num_test=counts['test'])
    with open(osp.join(dst_root, 'meta.json'), 'w') as f:  # last, as the preparation writes it
        json.dump(meta, f, indent=1, sort_keys=True)
    return dst_root
