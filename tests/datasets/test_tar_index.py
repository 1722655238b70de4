"""The tar-shard index: timm's WebDataset shards indexed without extracting, checked against the bytes and
labels the tests wrote; a label outside [0, num_classes) named with its sample."""
import pytest

from helpers.tar_index_fixtures import open_index, read_image, samples, wds  # noqa: F401 (fixtures)
from helpers.tar_shards import NUM_CLASSES, write_wds
from vit_plugin.datasets.tar_index import TarIndexError


def test_timm_layout_gives_every_sample_its_bytes_and_label(wds, samples):
    index = open_index(wds)
    assert len(index) == len(samples)
    assert [index.key(i) for i in range(len(index))] == [s.key for s in samples]
    assert index.labels.tolist() == [s.label for s in samples]
    assert all(read_image(index, i) == s.jpg for i, s in enumerate(samples))
    assert index.shard_starts.tolist() == [0, 7, 12, 21]
    assert index.location(8) == f'{wds}/imagenet22k-train-0001.tar:{samples[8].key}.jpg'


def test_a_label_out_of_range_is_named(tmp_path, samples):
    folder = str(tmp_path / 'labels')
    bad = list(samples[:6])
    bad[3] = bad[3]._replace(label=NUM_CLASSES + 4)
    write_wds(folder, bad, (6,), info=False)
    with pytest.raises(TarIndexError) as err:
        open_index(folder, num_classes=NUM_CLASSES)
    assert f'{bad[3].key}.jpg: label {NUM_CLASSES + 4} is outside [0, {NUM_CLASSES})' in str(err.value)
    assert 'Set num_classes' in str(err.value)
