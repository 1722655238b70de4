"""Bad data and bad checkpoints: a named error or a counted skip, never a crash hours in or a silent
wrong model.

* A generated corpus of broken and unusual files (helpers/bad_images.py) through every loader: each
  file gives Pillow's reference pixels or an ``ImageDecodeError`` with the expected reason.
* ``LoadAndInceptionCrop`` draws its box once: the boxes and pixels of a seeded sequence equal
  mmpretrain's ``RandomResizedCrop`` on the reference images, a header mismatch included.
* The skip policy (``vit_plugin.SkipBadSamples`` + ``SkipBadSamplesHook``): deterministic
  replacements, records through data-loader workers, a real training run that reports the exact count
  and resumes exactly, the stop past the limit, and the sum over two DDP processes.
* ``tools/infer.py`` and the ONNX export refuse a checkpoint whose head does not fit the config.
* An FSDP2 save under an existing name keeps a complete checkpoint at every step.
"""
import os
import os.path as osp
import re
import subprocess
import sys

import cv2
import numpy as np
import pytest
import torch
from mmengine.config import Config
from mmengine.dataset import Compose, default_collate, pseudo_collate
from mmengine.registry import init_default_scope
from mmpretrain.datasets.transforms import RandomResizedCrop
from PIL import Image, ImageFile

import vit_plugin.datasets.transforms as transforms
from helpers.bad_images import encode, photo, reference, write_corpus
from helpers.common import REPO, free_port, read_losses, run_env
from vit_plugin.apis.export_onnx import main as export_main
from vit_plugin.apis.infer import main as infer_main
from vit_plugin.datasets import decode
from vit_plugin.datasets.decode import ImageDecodeError, decode_image
from vit_plugin.datasets.skip import (BadSampleLimitExceeded, SkipBadSamples, records_in_batch,
                                      replacement_candidates)
from vit_plugin.datasets.transforms import LoadAndInceptionCrop, LoadImageFromFile

PAPER_RANGE = (0.05, 1.0)


@pytest.fixture(scope='module', autouse=True)
def mmpretrain_scope():
    init_default_scope('mmpretrain')


@pytest.fixture(scope='module')
def corpus(tmp_path_factory):
    return write_corpus(str(tmp_path_factory.mktemp('corpus')))


def read(path):
    with open(path, 'rb') as f:
        return f.read()


def whole_image_crop(path, shape):
    """LoadAndInceptionCrop set to take the whole image at its own size (so the output is the decode)."""
    height, width = shape[:2] if shape is not None else (8, 8)
    return LoadAndInceptionCrop(scale=(height, width), crop_ratio_range=(1.0, 1.0),
                                aspect_ratio_range=(width / height, width / height),
                                interpolation='nearest')(dict(img_path=path))['img']


def infer_reader(path, shape):
    from vit_plugin.inference import read_image
    return read_image(path)


#: name -> (function(path, expected shape) -> BGR pixels, uses OpenCV for JPEG/PNG)
LOADERS = {
    'decode_image': (lambda path, shape: decode_image(read(path), path), True),
    'decode_image(pillow)': (lambda path, shape: decode_image(read(path), path, backend='pillow'), False),
    'vit_plugin.LoadImageFromFile': (lambda path, shape: LoadImageFromFile()(dict(img_path=path))['img'], True),
    'vit_plugin.LoadImageFromFile(pillow)': (
        lambda path, shape: LoadImageFromFile(imdecode_backend='pillow')(dict(img_path=path))['img'], False),
    'LoadAndInceptionCrop': (whole_image_crop, True),
    'tools/infer.py': (infer_reader, True),
}


@pytest.mark.parametrize('loader', sorted(LOADERS))
def test_every_corpus_file_gives_reference_pixels_or_a_named_error(corpus, loader):
    load, uses_opencv = LOADERS[loader]
    assert len(corpus) == 28
    for name, case in corpus.items():
        if case.reason is not None:
            with pytest.raises(ImageDecodeError) as err:
                load(case.path, None)
            assert err.value.reason == case.reason, (loader, name, str(err.value))
            assert str(err.value).startswith(f'{case.path}: {case.reason} ('), (loader, name)
            assert err.value.path == case.path
            continue
        got = load(case.path, case.reference.shape)
        assert got.dtype == np.uint8 and got.shape == case.reference.shape, (loader, name, got.shape)
        diff = int(np.abs(got.astype(int) - case.reference).max())
        tolerance = case.cv2_tolerance if uses_opencv else 0
        assert diff <= tolerance, (loader, name, diff)


def test_corpus_differences_are_the_documented_ones(corpus):
    # What the tolerances and the special references stand for, measured on the files themselves.
    cmyk = corpus['cmyk.jpg']
    ours = decode_image(read(cmyk.path), cmyk.path)
    assert np.abs(ours.astype(int) - cmyk.reference).max() == 1  # OpenCV's rounding, not a bug of ours
    gray16 = corpus['gray_16bit.png']
    assert np.abs(reference(read(gray16.path)).astype(int) - gray16.reference).max() > 100  # Pillow clips
    # mmcv's loader (OpenCV) ignores an Exif segment that follows another APP1 segment; ours applies it
    from mmcv.transforms import LoadImageFromFile as MMCVLoadImageFromFile
    xmp = corpus['orientation_6_after_xmp.jpg']
    assert MMCVLoadImageFromFile()(dict(img_path=xmp.path))['img'].shape == (59, 77, 3)
    assert xmp.reference.shape == (77, 59, 3)
    # and the partial decode this module exists for: OpenCV returns pixels for a zero-padded cut file
    padded = corpus['truncated_50_zero_padded.jpg']
    assert cv2.imdecode(np.frombuffer(read(padded.path), np.uint8), cv2.IMREAD_COLOR) is not None


@pytest.mark.parametrize('fmt,kwargs', [('BMP', {}), ('WEBP', dict(lossless=True)), ('WEBP', dict(quality=90)),
                                        ('TIFF', {}), ('PNG', {})])
def test_other_formats_give_reference_pixels_orientation_included_and_truncation_is_found(fmt, kwargs):
    from helpers.bad_images import exif
    image = Image.fromarray(photo(30, 44))
    for orientation in ((1, 6) if fmt != 'BMP' else (1, )):
        extra = dict(exif=exif(orientation)) if orientation != 1 else {}
        data = encode(image, fmt, **kwargs, **extra)
        want = reference(data)
        assert want.shape == ((44, 30, 3) if orientation == 6 else (30, 44, 3))
        for backend in ('cv2', 'pillow'):
            np.testing.assert_array_equal(decode_image(data, 'x', backend=backend), want, err_msg=f'{fmt} {backend}')
        with pytest.raises(ImageDecodeError, match=rf'^y: truncated \({fmt}: ') as err:
            decode_image(data[:-7], 'y')
        assert err.value.reason == 'truncated'


def test_a_float_tiff_is_an_unsupported_mode():
    data = encode(Image.fromarray(np.linspace(0, 1, 300, dtype=np.float32).reshape(15, 20)), 'TIFF')
    with pytest.raises(ImageDecodeError, match=r'^f\.tif: unsupported mode \(TIFF with mode F'):
        decode_image(data, 'f.tif')


def test_truncation_is_caught_even_when_pillow_loads_truncated_images(corpus, monkeypatch):
    monkeypatch.setattr(ImageFile, 'LOAD_TRUNCATED_IMAGES', True)
    case = corpus['truncated_99.jpg']
    with Image.open(case.path) as image:
        image.load()  # Pillow now fills the rest with grey
    with pytest.raises(ImageDecodeError, match='truncated'):
        decode_image(read(case.path), case.path, backend='pillow')


def test_pixel_limit_is_configurable_and_checked_before_decoding(tmp_path, monkeypatch):
    path = str(tmp_path / 'photo.jpg')
    with open(path, 'wb') as f:
        f.write(encode(Image.fromarray(photo(60, 80)), 'JPEG', quality=90))

    def no_decode(*args, **kwargs):
        raise AssertionError('decoded a file over the limit')

    monkeypatch.setattr(cv2, 'imdecode', no_decode)
    for loader in (LoadImageFromFile(max_pixels=4799), LoadAndInceptionCrop(16, max_pixels=4799)):
        with pytest.raises(ImageDecodeError, match=r'too large \(the JPEG header declares 80 x 60 = 4,800 pixels, '
                                                   r'more than max_pixels=4,799\)'):
            loader(dict(img_path=path))
    monkeypatch.undo()
    assert LoadImageFromFile(max_pixels=4800)(dict(img_path=path))['img'].shape == (60, 80, 3)
    assert LoadImageFromFile(max_pixels=None)(dict(img_path=path))['img'].shape == (60, 80, 3)
    assert decode.DEFAULT_MAX_PIXELS == 2 * Image.MAX_IMAGE_PIXELS  # Pillow's own refusal threshold
    with pytest.raises(ValueError, match=r'ignore_empty=True\) would replace unreadable files'):
        LoadImageFromFile(ignore_empty=True)


def test_decode_errors_survive_pickling_through_workers():
    import pickle
    err = decode.image_error('/data/x.JPEG', decode.TRUNCATED, 'JPEG: no end-of-image marker')
    again = pickle.loads(pickle.dumps(err))
    assert (again.path, again.reason, again.detail, str(again)) == (err.path, err.reason, err.detail, str(err))
    assert type(err)(str(err)).args == err.args  # how torch re-raises a worker's exception


# ---------------------------------------------------------------------------------- the crop box
def test_boxes_and_pixels_equal_random_resized_crop_over_a_sequence_with_a_header_mismatch(corpus, monkeypatch):
    # One seeded stream over a sequence of files, as a data-loader worker sees them. The XMP file is the
    # case where the JPEG header (its Exif orientation) and OpenCV's decoding disagree; our box is drawn
    # once, for the displayed size, and every later box still matches.
    names = ['orientation_1.jpg', 'orientation_6_after_xmp.jpg', 'png_named.jpg', 'orientation_8.jpg',
             'gif_named.jpg', 'orientation_6_after_xmp.jpg', 'cmyk.jpg', 'caf\u00e9 \u6771\u4eac.jpg']
    boxes = []
    box = transforms.inception_crop_box
    monkeypatch.setattr(transforms, 'inception_crop_box', lambda *a, **k: boxes.append(box(*a, **k)) or boxes[-1])
    ours = LoadAndInceptionCrop(32, crop_ratio_range=PAPER_RANGE)
    theirs = RandomResizedCrop(32, crop_ratio_range=PAPER_RANGE)
    for seed in range(5):
        np.random.seed(seed)
        boxes.clear()
        got = [ours(dict(img_path=corpus[n].path))['img'] for n in names]
        assert len(boxes) == len(names)  # one draw per image
        np.random.seed(seed)
        for n, img, drawn in zip(names, got, boxes):
            ref = corpus[n].reference
            assert theirs.rand_crop_params(ref) == drawn, (seed, n)
        np.random.seed(seed)
        for n, img in zip(names, got):
            want = theirs(dict(img=corpus[n].reference.copy()))['img']
            if n == 'cmyk.jpg':  # decoded within 1 level of the reference; the resize may round that to 2
                assert np.abs(img.astype(int) - want).max() <= 2
            else:
                np.testing.assert_array_equal(img, want, err_msg=f'{seed} {n}')


def test_a_decoder_that_disagrees_with_the_header_moves_the_box_without_a_new_draw(corpus, monkeypatch):
    # Whatever a decoder returns, the random stream after the transform is that of one box draw.
    case = corpus['orientation_1.jpg']
    real_decode = decode.decode_stored
    monkeypatch.setattr(decode, 'decode_stored',
                        lambda *a, **k: cv2.resize(real_decode(*a, **k), (154, 118), interpolation=cv2.INTER_NEAREST))
    np.random.seed(3)
    box = transforms.inception_crop_box(59, 77, PAPER_RANGE)
    after_one_draw = np.random.get_state()[1].copy()
    np.random.seed(3)
    out = LoadAndInceptionCrop(16, crop_ratio_range=PAPER_RANGE)(dict(img_path=case.path))
    np.testing.assert_array_equal(np.random.get_state()[1], after_one_draw)
    assert out['ori_shape'] == (118, 154)
    top, left, h, w = transforms.map_box(box, (59, 77), (118, 154))
    assert (top, left, h, w) == (2 * box[0], 2 * box[1], 2 * box[2], 2 * box[3])
    big = cv2.resize(real_decode(read(case.path), case.path, decode.inspect_image(read(case.path), case.path)),
                     (154, 118), interpolation=cv2.INTER_NEAREST)
    np.testing.assert_array_equal(out['img'], cv2.resize(big[top:top + h, left:left + w], (16, 16),
                                                         interpolation=cv2.INTER_LINEAR))


# ----------------------------------------------------------------------------------- skip policy
class TinyDataset:
    """Five samples; the pipeline of sample ``i`` raises what ``errors[i]`` says."""
    test_mode = False

    def __init__(self, errors):
        self.errors = errors
        self.metainfo = {'classes': ('a', 'b')}

    def __len__(self):
        return 5

    def full_init(self):
        pass

    def get_data_info(self, i):
        return {'img_path': f'/data/{i}.jpg'}

    def __getitem__(self, i):
        from mmpretrain.structures import DataSample
        error = self.errors.get(i)
        if error == 'truncated':
            raise decode.image_error(f'/data/{i}.jpg', decode.TRUNCATED, 'JPEG: no end-of-image marker')
        if error == 'missing':
            raise FileNotFoundError(2, 'No such file', f'/data/{i}.jpg')
        if error == 'bug':
            raise KeyError('img_shape')
        return {'inputs': torch.full((1, ), float(i)), 'data_samples': DataSample(metainfo={'sample_idx': i})}


def test_bad_samples_are_replaced_deterministically_and_recorded():
    wrapper = SkipBadSamples(TinyDataset({1: 'truncated', 2: 'missing'}), max_fraction=0.4)
    assert wrapper.allowed == 2 and len(wrapper) == 5 and wrapper.metainfo == {'classes': ('a', 'b')}
    candidates = replacement_candidates(1, 5, 16)
    assert candidates[0] == 2 and 1 not in candidates and all(0 <= c < 5 for c in candidates)
    assert candidates == replacement_candidates(1, 5, 16)  # a pure function: no generator consumed
    first = wrapper[1]  # 1 -> 2 (also bad) -> the next candidate
    assert first['inputs'].item() == candidates[1] != 2
    assert first['data_samples'].bad_samples == ((1, '/data/1.jpg', 'truncated (JPEG: no end-of-image marker)'),
                                                 (2, '/data/2.jpg', 'missing file'))
    assert wrapper[1]['inputs'].item() == candidates[1]  # the same replacement every time
    assert 'bad_samples' not in wrapper[0]['data_samples']
    batch = pseudo_collate([wrapper[i] for i in range(5)])
    assert [r[0] for r in records_in_batch(batch)] == [1, 2, 2]  # sample 2: its own replacement record
    assert [r[0] for r in records_in_batch(default_collate([wrapper[1]]))] == [1, 2]
    with pytest.raises(KeyError):  # any other error is a bug: it still stops
        SkipBadSamples(TinyDataset({0: 'bug'}), max_fraction=0.5)[0]
    with pytest.raises(BadSampleLimitExceeded, match='the limit of 0 bad samples'):
        SkipBadSamples(TinyDataset({4: 'truncated'}), max_fraction=0.1)[4]
    with pytest.raises(BadSampleLimitExceeded, match='its 2 replacement candidates are all bad'):
        SkipBadSamples(TinyDataset({i: 'missing' for i in range(5)}), max_fraction=0.9, max_attempts=2)[0]
    with pytest.raises(ValueError, match='max_fraction must be in'):
        SkipBadSamples(TinyDataset({}), max_fraction=1.5)


def collate_records(batch):
    """Module level, so spawned workers can unpickle it."""
    return records_in_batch(pseudo_collate(batch))


def test_records_travel_from_worker_processes_with_the_batch():
    import pickle

    from torch.utils.data import DataLoader
    wrapper = SkipBadSamples(TinyDataset({1: 'truncated', 4: 'missing'}), max_fraction=0.4)
    loader = DataLoader(wrapper, batch_size=2, num_workers=2, collate_fn=collate_records)
    assert sorted(r[:2] for batch in loader for r in batch) == [(1, '/data/1.jpg'), (4, '/data/4.jpg')]
    again = pickle.loads(pickle.dumps(wrapper))  # what spawned workers receive
    assert again[4]['data_samples'].bad_samples[0][:2] == (4, '/data/4.jpg') and again.allowed == 2


def make_list_dataset(root, bad):
    """200 24x24 JPEGs of 4 colour classes in the list-file layout, the indices in ``bad`` broken
    (a truncated JPEG and an HTML page)."""
    os.makedirs(osp.join(root, 'meta'), exist_ok=True)
    lines = []
    rng = np.random.default_rng(0)
    colours = [(200, 40, 40), (40, 200, 40), (40, 40, 200), (200, 200, 40)]
    for i in range(200):
        label = i % 4
        rel = f'c{label}/{i:03d}.jpg'
        path = osp.join(root, 'train', rel)
        os.makedirs(osp.dirname(path), exist_ok=True)
        pixels = np.clip(np.array(colours[label]) + rng.integers(-60, 60, (24, 24, 3)), 0, 255).astype(np.uint8)
        data = encode(Image.fromarray(pixels), 'JPEG', quality=90)
        if i == bad[0]:
            data = data[:-10]  # the last bytes of the image data and the end-of-image marker are missing
        elif i in bad[1:]:
            data = b'<html>503 Service Unavailable</html>\n'
        with open(path, 'wb') as f:
            f.write(data)
        lines.append(f'{rel} {label}\n')
    with open(osp.join(root, 'meta', 'train.txt'), 'w') as f:
        f.writelines(lines)
    return root


def skip_config(path, root, *, max_fraction=0.01, batch_size=20, workers=2, epochs=3, record_losses=True):
    path.write_text(f"""
_base_ = [{osp.join(REPO, 'configs', 'vit_demo_digits.py')!r}]
custom_imports = dict(imports=['vit_plugin'] + (['loss_recorder'] if {record_losses} else []),
                      allow_failed_imports=False)
num_classes = 4
data_preprocessor = dict(num_classes=num_classes)
model = dict(backbone=dict(arch=dict(embed_dims=32, num_layers=2, num_heads=2, mlp_dims=64), img_size=16,
                           patch_size=8),
             head=dict(num_classes=num_classes, in_channels=32))
train_dataloader = dict(
    batch_size={batch_size}, num_workers={workers}, persistent_workers=False,
    sampler=dict(type='DefaultSampler', shuffle=True, seed=0),
    dataset=dict(_delete_=True, type='vit_plugin.SkipBadSamples', max_fraction={max_fraction},
                 dataset=dict(type='vit_plugin.ImageNet21k', data_root={root!r}, ann_file='meta/train.txt',
                              data_prefix='train', num_classes=num_classes,
                              pipeline=[dict(type='vit_plugin.LoadAndInceptionCrop', scale=16,
                                             crop_ratio_range=(0.5, 1.0)),
                                        dict(type='RandomFlip', prob=0.5, direction='horizontal'),
                                        dict(type='PackInputs')])))
val_dataloader = None
val_evaluator = None
val_cfg = None
test_dataloader = None
test_evaluator = None
test_cfg = None
param_scheduler = []
train_cfg = dict(by_epoch=True, max_epochs={epochs}, val_interval=1000)
default_hooks = dict(logger=dict(interval=1), checkpoint=dict(by_epoch=True, interval=1, max_keep_ckpts=5))
custom_hooks = [dict(type='LossRecorderHook')] if {record_losses} else []
""")
    return str(path)


def first_indices_of_each_rank(n=200, seed=0, epoch=0):
    """The first sample of rank 0 and of rank 1 under mmengine's DefaultSampler (shuffled, 2 ranks)."""
    g = torch.Generator()
    g.manual_seed(seed + epoch)
    order = torch.randperm(n, generator=g).tolist()
    return order[0], order[1]


def train(cfg, work, *extra):
    proc = subprocess.run([sys.executable, osp.join(REPO, 'tools', 'train.py'), cfg, '--work-dir', str(work), *extra],
                          env=run_env(), capture_output=True, text=True, timeout=600, cwd=REPO)
    return proc


def checkpoint_meta(path):
    return torch.load(path, map_location='cpu', weights_only=False)['meta']


@pytest.mark.slow
def test_skip_policy_run_reports_the_exact_count_and_resumes_exactly(tmp_path):
    bad = first_indices_of_each_rank()
    root = make_list_dataset(str(tmp_path / 'data'), bad)
    cfg = skip_config(tmp_path / 'cfg.py', root)
    full = train(cfg, tmp_path / 'full')
    assert full.returncode == 0, full.stderr[-4000:]
    log = full.stdout + full.stderr
    paths = {i: osp.join(root, 'train', f'c{i % 4}/{i:03d}.jpg') for i in bad}
    for i, reason in zip(bad, ('truncated (JPEG: no end-of-image marker', "not an image (no JPEG")):
        lines = [line for line in log.splitlines() if f'skipped bad sample {i}: {paths[i]}: {reason}' in line]
        assert len(lines) == 1, (i, lines)  # logged once, though met in all three epochs
    for epoch in (1, 2, 3):
        assert (f'SkipBadSamples after epoch {epoch}: 2 bad samples skipped ({2 * epoch} replacements), the limit '
                f'of 2 bad samples (max_fraction=0.01 of 200 samples).') in log
    meta = checkpoint_meta(tmp_path / 'full' / 'epoch_3.pth')['bad_samples']
    assert meta['count'] == 2 and meta['replacements'] == 6 and [f[0] for f in meta['files']] == sorted(bad)
    reference = read_losses(tmp_path / 'full')
    assert sorted(reference) == list(range(30))

    resumed = train(cfg, tmp_path / 'resumed', '--resume', str(tmp_path / 'full' / 'epoch_1.pth'))
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    after = read_losses(tmp_path / 'resumed')
    assert sorted(after) == list(range(10, 30))
    np.testing.assert_allclose([after[i] for i in range(10, 30)], [reference[i] for i in range(10, 30)],
                               rtol=0, atol=1e-6)
    log = resumed.stdout + resumed.stderr
    assert '2 counted so far' in log and 'skipped bad sample' not in log  # the count continues
    assert 'SkipBadSamples after epoch 3: 2 bad samples skipped (6 replacements)' in log


def test_skip_policy_stops_past_the_limit_naming_it(tmp_path):
    # Three bad samples, in the first three batches, so in both data-loader workers (neither reaches the
    # limit alone): the training process counts all three after iteration 3 and stops there.
    from mmengine.runner import Runner
    g = torch.Generator()
    g.manual_seed(0)
    order = torch.randperm(200, generator=g).tolist()
    root = make_list_dataset(str(tmp_path / 'data'), (order[0], order[20], order[40]))
    cfg = Config.fromfile(skip_config(tmp_path / 'cfg.py', root, workers=2, epochs=1, record_losses=False))
    cfg.work_dir = str(tmp_path / 'work')
    runner = Runner.from_cfg(cfg)
    with pytest.raises(BadSampleLimitExceeded, match=re.escape(
            '3 distinct bad samples exceed the limit of 2 bad samples (max_fraction=0.01 of 200 samples) at '
            'iteration 3; the latest: ') + '.*Fix or remove the files'):
        runner.train()
    assert runner.iter == 2 and not osp.exists(tmp_path / 'work' / 'epoch_1.pth')


@pytest.mark.slow
def test_skip_policy_sums_the_counts_of_ddp_processes(tmp_path):
    bad = first_indices_of_each_rank()  # one bad sample in each process's share of epoch 1
    root = make_list_dataset(str(tmp_path / 'data'), bad)
    cfg = skip_config(tmp_path / 'cfg.py', root, batch_size=10, workers=1, epochs=1)
    env = dict(run_env(), PORT=str(free_port()))
    work = tmp_path / 'ddp'
    proc = subprocess.run(['bash', osp.join(REPO, 'tools', 'dist_train.sh'), cfg, '2', '--work-dir', str(work)],
                          env=env, capture_output=True, text=True, timeout=600, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-4000:]
    log = proc.stdout + proc.stderr
    for i in bad:  # rank 0 logs both, the one of rank 1 too
        assert len(re.findall(rf'skipped bad sample {i}: ', log)) == 1, log[-3000:]
    assert 'SkipBadSamples after epoch 1: 2 bad samples skipped (2 replacements)' in log
    assert checkpoint_meta(work / 'epoch_1.pth')['bad_samples']['count'] == 2


# ----------------------------------------------------------------------- checkpoints for inference
def tiny_classifier(tmp_path, head_classes):
    """The demo config shrunk to 2 blocks, and a checkpoint of it whose head has ``head_classes``."""
    cfg = tmp_path / 'tiny.py'
    cfg.write_text(f"""
_base_ = [{osp.join(REPO, 'configs', 'vit_demo_digits.py')!r}]
model = dict(backbone=dict(arch=dict(_delete_=True, embed_dims=32, num_layers=2, num_heads=2, mlp_dims=64)),
             head=dict(in_channels=32))
test_dataloader = dict(dataset=dict(data_root={str(tmp_path / 'digits')!r}))
""")
    from mmengine.registry import DefaultScope
    from mmpretrain.registry import MODELS
    config = Config.fromfile(str(cfg))
    config.model.head.num_classes = head_classes
    with DefaultScope.overwrite_default_scope('mmpretrain'):
        model = MODELS.build(config.model)
    ckpt = tmp_path / f'head{head_classes}.pth'
    torch.save(dict(meta=dict(dataset_meta=dict(classes=[str(i) for i in range(head_classes)])),
                    state_dict=model.state_dict()), ckpt)
    return str(cfg), str(ckpt)


def test_infer_and_export_refuse_a_checkpoint_whose_head_does_not_fit(tmp_path, corpus):
    config, wrong = tiny_classifier(tmp_path, head_classes=7)  # the config's head has 10 classes
    _, right = tiny_classifier(tmp_path, head_classes=10)
    image = str(tmp_path / 'digit.png')  # the demo's test pipeline takes 32x32 images as they are
    Image.fromarray(photo(32, 32)).save(image)
    infer = infer_main
    shapes = re.escape('head.layers.head.weight has shape (7, 32) in the checkpoint and (10, 32) in the model')
    with pytest.raises(SystemExit, match=shapes + '.*pass --backbone-only to load only the backbone on purpose'):
        infer([config, wrong, image, '--device', 'cpu'])
    assert len(infer([config, right, image, '--device', 'cpu', '--topk', '2'])[0]['topk']) == 2
    assert len(infer([config, wrong, image, '--device', 'cpu', '--backbone-only'])) == 1  # on purpose
    with pytest.raises(SystemExit, match=r'text\.JPEG: not an image'):
        infer([config, right, corpus['text.JPEG'].path, '--device', 'cpu'])

    export = export_main
    with pytest.raises(SystemExit, match=shapes + '.*pass --part backbone'):
        export([config, wrong, '--out', str(tmp_path / 'wrong.onnx')])
    assert not osp.exists(tmp_path / 'wrong.onnx')
    result = export([config, wrong, '--out', str(tmp_path / 'backbone.onnx'), '--part', 'backbone'])
    assert osp.isfile(result['onnx'])


def test_strict_loading_still_adapts_the_position_embedding_and_refuses_other_models(tmp_path):
    from mmpretrain.apis import get_model

    from vit_plugin.checkpoint import CheckpointMismatchError, load_checkpoint_strict
    config, right = tiny_classifier(tmp_path, head_classes=10)
    cfg = Config.fromfile(config)
    cfg.model.backbone.img_size = 48  # another grid: the loading hook resizes the position embedding
    model = get_model(cfg, pretrained=False)
    assert load_checkpoint_strict(model, right)['meta']['dataset_meta']['classes'][9] == '9'
    cfg.model.backbone.arch.num_layers = 3
    with pytest.raises(CheckpointMismatchError, match=r'the checkpoint has 2 encoder blocks but the model has 3'):
        load_checkpoint_strict(get_model(cfg, pretrained=False), right)
    cfg.model.backbone.arch.num_layers = 2
    cfg.model.head.hidden_dim = 16  # a pre-logits layer the checkpoint lacks
    with pytest.raises(CheckpointMismatchError, match=r'head\.layers\.pre_logits\.weight \(16, 32\) is not in the '
                                                      r'checkpoint'):
        load_checkpoint_strict(get_model(cfg, pretrained=False), right)


# ------------------------------------------------------------------------------------ FSDP2 saves
def test_fsdp2_save_under_an_existing_name_always_keeps_a_complete_checkpoint(tmp_path, monkeypatch):
    import shutil

    import torch.nn as nn

    from vit_plugin.engine import fsdp2
    from vit_plugin.engine.checkpointing import checkpoint_problem, find_resumable_checkpoint
    strategy = fsdp2.FSDP2Strategy(work_dir=str(tmp_path / 'logs'))
    strategy.model = nn.Linear(3, 2)
    work = tmp_path / 'work'
    work.mkdir()
    target = str(work / 'iter_8.pth')

    def save(iteration):
        strategy.save_checkpoint(target, save_optimizer=False, save_param_scheduler=False,
                                 extra_ckpt=dict(meta=dict(iter=iteration)))

    def meta_of(path):
        return torch.load(osp.join(path, fsdp2.EXTRA_FILE), weights_only=False)['meta']['iter']

    save(1)
    states = []  # at every rename and deletion: which complete checkpoint the work dir offers
    real_replace, real_rmtree = os.replace, shutil.rmtree

    def record(*args, **kwargs):
        found = find_resumable_checkpoint(str(work), warn=None)
        states.append(None if found is None else (osp.basename(found), meta_of(found)))

    def replace(src, dst):
        record()
        real_replace(src, dst)

    def rmtree(path, *args, **kwargs):
        record()
        real_rmtree(path, *args, **kwargs)

    monkeypatch.setattr(fsdp2.os, 'replace', replace)
    monkeypatch.setattr(fsdp2.shutil, 'rmtree', rmtree)
    strategy.model.weight.data.fill_(2.0)
    save(2)
    record()
    assert None not in states
    assert states[-1] == ('iter_8.pth', 2) and ('iter_8.pth.old', 1) in states
    assert sorted(os.listdir(work)) == ['iter_8.pth']

    # A crash between the two renames: the old checkpoint is complete under the aside name and --resume
    # takes it; the next save under the name clears it.
    def crash_on_commit(src, dst):
        if src.endswith('.part'):
            raise KeyboardInterrupt('killed')
        real_replace(src, dst)

    monkeypatch.setattr(fsdp2.os, 'replace', crash_on_commit)
    monkeypatch.setattr(fsdp2.shutil, 'rmtree', real_rmtree)
    with pytest.raises(KeyboardInterrupt):
        save(3)
    assert sorted(os.listdir(work)) == ['iter_8.pth.old', 'iter_8.pth.part']
    found = find_resumable_checkpoint(str(work), warn=None)
    assert osp.basename(found) == 'iter_8.pth.old' and meta_of(found) == 2 and checkpoint_problem(found) is None
    monkeypatch.setattr(fsdp2.os, 'replace', real_replace)
    save(4)
    assert sorted(os.listdir(work)) == ['iter_8.pth'] and meta_of(target) == 4

