"""The embedded digits dataset: complete, deterministic and prepared once."""
import os
import os.path as osp

import numpy as np
import pytest

from vit_plugin.datasets.digits import prepare_digits_dataset


pytestmark = pytest.mark.slow


# ---------------------------------------------------------------- data and batch bookkeeping
def test_digits_dataset_is_complete_deterministic_and_idempotent(tmp_path):
    import hashlib
    from sklearn.datasets import load_digits

    root = prepare_digits_dataset(str(tmp_path / 'digits'))
    files = sorted(p for p in glob_png(root))
    assert len(files) == 1797
    targets = load_digits().target
    counts = {'train': 0, 'test': 0}
    for path in files:  # <root>/<split>/<class>/<sklearn index>.png
        split, cls, name = path.split(os.sep)[-3:]
        assert int(cls) == targets[int(name[:-4])]
        counts[split] += 1
    assert counts == {'train': 1438, 'test': 359}
    digest = hashlib.sha256(b''.join(open(p, 'rb').read() for p in files)).hexdigest()
    mtime = os.stat(files[0]).st_mtime_ns
    assert prepare_digits_dataset(root) == root and os.stat(files[0]).st_mtime_ns == mtime  # reused
    other = prepare_digits_dataset(str(tmp_path / 'again'))
    again = sorted(glob_png(other))
    assert hashlib.sha256(b''.join(open(p, 'rb').read() for p in again)).hexdigest() == digest

    from PIL import Image
    img = np.asarray(Image.open(files[0]))
    assert img.shape == (32, 32) and img.max() > 200  # enlarged, and scaled from 0..16 to 0..255


def glob_png(root):
    import glob
    return glob.glob(osp.join(root, '*', '*', '*.png'))
