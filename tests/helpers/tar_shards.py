"""Tar shards made by the tests: timm's WebDataset layout (with its ``_info.json``) and image-net.org's
tar of per-synset tars, from generated JPEG images of a few real synsets."""
import io
import json
import os
import os.path as osp
import tarfile
from typing import Dict, List, NamedTuple, Sequence

import cv2
import numpy as np

from vit_plugin import label_spaces

#: The first synsets of the fall11 order (timm's 22k shards): toy classes that are real synsets.
NUM_CLASSES = 6


class Sample(NamedTuple):
    key: str
    label: int  # in the toy class order (the first NUM_CLASSES synsets of fall11)
    synset: str
    jpg: bytes


def toy_synsets(count: int = NUM_CLASSES) -> List[str]:
    return list(label_spaces.synsets('fall11')[:count])


def make_samples(count: int, seed: int = 0, size: int = 24, num_classes: int = NUM_CLASSES,
                 synsets: Sequence[str] = ()) -> List[Sample]:
    """``count`` samples of random classes: a flat colour per class plus noise, as JPEG. The classes are
    ``synsets`` (label ``i`` is ``synsets[i]``), by default the first ``num_classes`` of fall11."""
    rng = np.random.default_rng(seed)
    synsets = list(synsets) or toy_synsets(num_classes)
    num_classes = len(synsets)
    samples = []
    for i in range(count):
        label = int(rng.integers(num_classes))
        img = np.full((size + i % 5, size, 3), 40 * label, np.uint8) + rng.integers(0, 30, (size + i % 5, size, 3),
                                                                                        dtype=np.uint8)
        ok, jpg = cv2.imencode('.jpg', img)
        assert ok
        samples.append(Sample(f'{synsets[label]}_{1000 + i}', label, synsets[label], jpg.tobytes()))
    return samples


def add_member(tf: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mtime = 0
    tf.addfile(info, io.BytesIO(data))


def write_wds(folder: str, samples: Sequence[Sample], per_shard: Sequence[int], prefix: str = 'imagenet22k',
              split: str = 'train', info: bool = True, members=('jpg', 'cls', 'json')) -> List[str]:
    """Shards ``<prefix>-<split>-NNNN.tar`` in timm's layout (``.jpg``, ``.cls``, ``.json`` per sample) and,
    with ``info``, the ``_info.json`` of timm's readers; returns the shard names."""
    os.makedirs(folder, exist_ok=True)
    names, start = [], 0
    for s, count in enumerate(per_shard):
        name = f'{prefix}-{split}-{s:04d}.tar'
        with tarfile.open(osp.join(folder, name), 'w', format=tarfile.GNU_FORMAT) as tf:
            for sample in samples[start:start + count]:
                if 'jpg' in members:
                    add_member(tf, sample.key + '.jpg', sample.jpg)
                if 'cls' in members:
                    add_member(tf, sample.key + '.cls', str(sample.label).encode())
                if 'json' in members:
                    meta = {'label': sample.label, 'class_name': sample.synset, 'filename': sample.key + '.JPEG'}
                    add_member(tf, sample.key + '.json', json.dumps(meta).encode())
        names.append(name)
        start += count
    if info:
        path = osp.join(folder, '_info.json')
        existing = json.load(open(path)) if osp.exists(path) else {'name': prefix, 'splits': {}}
        existing['splits'][split] = {'name': split, 'num_samples': int(sum(per_shard)), 'filenames': names,
                                     'shard_lengths': [int(c) for c in per_shard]}
        with open(path, 'w') as f:
            json.dump(existing, f)
    return names


def write_tar_of_tars(path: str, samples: Sequence[Sample]) -> Dict[str, List[str]]:
    """A tar of ``<synset>.tar`` members, each holding that synset's images as ``<key>.JPEG`` (as
    ``ILSVRC2012_img_train.tar`` and ``fall11_whole.tar``); returns the keys of each synset, in order."""
    by_synset: Dict[str, List[Sample]] = {}
    for sample in samples:
        by_synset.setdefault(sample.synset, []).append(sample)
    with tarfile.open(path, 'w', format=tarfile.GNU_FORMAT) as outer:
        for synset in sorted(by_synset):
            inner = io.BytesIO()
            with tarfile.open(fileobj=inner, mode='w', format=tarfile.GNU_FORMAT) as tf:
                for sample in by_synset[synset]:
                    add_member(tf, sample.key + '.JPEG', sample.jpg)
            add_member(outer, synset + '.tar', inner.getvalue())
    return {s: [x.key for x in v] for s, v in sorted(by_synset.items())}
