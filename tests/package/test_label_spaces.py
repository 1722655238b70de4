"""The label spaces against timm's own reader of the same lists (``timm.data.ImageNetInfo``) and timm's
shipped Google-to-fall11 index file; label translation, its errors, and spaces built from data."""
import pkgutil
import sys

import numpy as np
import pytest
from timm.data import ImageNetInfo

from vit_plugin import label_spaces
from vit_plugin.label_spaces import (LabelSpaceError, canonical_name, class_names, forget_label_space, index_map,
                                     label_space_from_synsets, num_classes, remap_labels, spaces_of_size,
                                     synset_index, synsets)

#: Our names -> timm's subset names of the same lists.
TIMM_SUBSETS = {'fall11': 'imagenet-22k', 'google21k': 'imagenet-21k-goog', 'imagenet1k': 'imagenet-1k'}
GOOGLE_ONLY = {9205: 'n03931044', 15027: 'n09859684'}  # the two Google classes fall11 lacks


@pytest.fixture(scope='module')
def timm_info():
    return {name: ImageNetInfo(subset) for name, subset in TIMM_SUBSETS.items()}


@pytest.fixture(scope='module')
def timm_goog_to_22k():
    """timm's shipped map: the Google row of each fall11 row (an independent reference: we compute ours
    from the two synset lists)."""
    text = pkgutil.get_data('timm.data', '_info/imagenet21k_goog_to_22k_indices.txt').decode()
    return np.array([int(v) for v in text.split()], dtype=np.int64)


def test_counts_are_the_releases():
    assert [num_classes(s) for s in ('fall11', 'google21k', 'imagenet1k', 'winter21')] == [21841, 21843, 1000, 19167]
    assert [len(synsets(s)) for s in ('fall11', 'google21k', 'imagenet1k')] == [21841, 21843, 1000]


@pytest.mark.parametrize('space', sorted(TIMM_SUBSETS))
def test_synsets_are_timms(space, timm_info):
    assert list(synsets(space)) == timm_info[space].label_names()


@pytest.mark.parametrize('space', ['fall11', 'google21k'])
def test_class_names_are_timms_lemmas(space, timm_info):
    assert list(class_names(space)) == timm_info[space].label_descriptions()


def test_imagenet1k_names_follow_the_synsets(timm_info):
    """mmpretrain's list (no timm needed) in the order of the sorted synsets: each entry's first name is
    the WordNet lemma's (the onedl build spells two of the later names otherwise)."""
    ours, lemmas = class_names('in1k'), timm_info['imagenet1k'].label_descriptions()
    assert len(ours) == 1000 and [n.split(',')[0] for n in ours] == [n.split(',')[0] for n in lemmas]


def test_aliases_name_the_same_space():
    assert {canonical_name(a) for a in ('fall11', 'imagenet22k', 'in22k', 'ImageNet-22k', 'imagenet_22k')} == {'fall11'}
    assert {canonical_name(a) for a in ('google21k', 'imagenet21k_goog', 'in21k', 'imagenet-21k-goog')} == {'google21k'}
    assert {canonical_name(a) for a in ('winter21', 'imagenet-w21', 'w21')} == {'winter21'}
    assert {canonical_name(a) for a in ('imagenet1k', 'in1k', 'imagenet-1k')} == {'imagenet1k'}


def test_an_unknown_space_is_named_with_the_choices():
    with pytest.raises(LabelSpaceError, match=r"unknown label space 'in30k'.*fall11, google21k, imagenet1k, winter21"):
        synsets('in30k')


def test_index_map_fall11_to_google_is_timms_file(timm_goog_to_22k):
    mapping = index_map('fall11', 'google21k')
    assert mapping.dtype == np.int64 and np.array_equal(mapping, timm_goog_to_22k)


def test_google_to_fall11_lacks_exactly_two_classes(timm_info):
    mapping = index_map('in21k', 'in22k')
    fall11 = {s: i for i, s in enumerate(timm_info['fall11'].label_names())}
    expected = [fall11.get(s, -1) for s in timm_info['google21k'].label_names()]
    assert mapping.tolist() == expected and {i: synsets('google21k')[i] for i in np.flatnonzero(mapping < 0)} == \
        GOOGLE_ONLY


def test_imagenet1k_in_fall11_lacks_only_teddy_bear():
    """ILSVRC-2012's n04399382 (teddy bear) is in neither 21k release."""
    mapping = index_map('imagenet1k', 'fall11')
    assert [synsets('imagenet1k')[i] for i in np.flatnonzero(mapping < 0)] == ['n04399382']


def test_synset_index_inverts_synsets():
    index = synset_index('google21k')
    assert len(index) == 21843 and all(synsets('google21k')[i] == s for s, i in index.items())


def test_labels_round_trip_through_the_larger_space():
    labels = np.arange(21841).reshape(-1, 1)
    back = remap_labels(remap_labels(labels, 'fall11', 'google21k'), 'google21k', 'fall11')
    assert back.shape == labels.shape and np.array_equal(back, labels)


def test_remap_to_a_smaller_space_can_mark_missing_labels():
    out = remap_labels(np.arange(21843), 'google21k', 'fall11', allow_missing=True)
    assert {int(i): synsets('google21k')[i] for i in np.flatnonzero(out < 0)} == GOOGLE_ONLY


def test_remap_names_the_first_label_without_counterpart():
    with pytest.raises(LabelSpaceError, match=r"label 9205 \(n03931044\) of 'google21k' at index \(1,\).*2 such "
                                              r'labels.*allow_missing=True'):
        remap_labels([0, 9205, 15027], 'google21k', 'fall11')


def test_remap_refuses_a_label_outside_the_source():
    with pytest.raises(LabelSpaceError, match=r"label 1000 at index \(2,\) is not a label of 'imagenet1k'"):
        remap_labels([0, 5, 1000], 'in1k', 'fall11')


@pytest.fixture
def toy_space():
    """A registered space built from data (repeats and any order), forgotten afterwards."""
    found = ['n00000003', 'n00000001', 'n00000003', 'n00000002']
    yield label_space_from_synsets(found, 'toy-space', expected=3)
    forget_label_space('toy_space')


def test_a_space_from_data_is_its_sorted_distinct_synsets(toy_space):
    assert toy_space == ('n00000001', 'n00000002', 'n00000003') and synsets('TOY_SPACE') == toy_space
    assert num_classes('toy-space') == 3 and spaces_of_size(3) == ('toy-space', )


def test_a_space_from_data_maps_into_the_builtin_ones(toy_space):
    assert index_map('toy-space', 'fall11').tolist() == [-1, -1, -1]


def test_a_space_from_data_keeps_its_synsets(toy_space):
    label_space_from_synsets(['n00000002', 'n00000001', 'n00000003'], 'toy-space', expected=3)  # the same: fine
    with pytest.raises(LabelSpaceError, match="'toy-space' is already registered with 3 other synsets"):
        label_space_from_synsets(['n00000001', 'n00000002', 'n00000004'], 'toy-space', expected=3)


def test_winter21_from_data_must_have_its_count():
    with pytest.raises(LabelSpaceError, match="holds 2 distinct synsets, but label space 'winter21' has 19167.*"
                                              'expected=0'):
        label_space_from_synsets(['n00000001', 'n00000002'], 'imagenet-w21')
    with pytest.raises(LabelSpaceError, match="'winter21' has no list installed anywhere.*label_space_from_synsets"):
        synsets('winter21')


def test_a_space_from_data_refuses_what_is_no_synset():
    with pytest.raises(LabelSpaceError, match=r"'n0144076' is not a WordNet synset id"):
        label_space_from_synsets(['n01440764', 'n0144076'], 'other', expected=0)
    with pytest.raises(LabelSpaceError, match="read from timm's imagenet22k_synsets.txt"):
        label_space_from_synsets(['n01440764'], 'in22k')


def test_without_timm_a_clear_error_and_what_needs_no_timm(monkeypatch):
    monkeypatch.setitem(sys.modules, 'timm', None)  # find_spec('timm') now answers None, as when not installed
    label_spaces.clear_cache()
    try:
        with pytest.raises(ModuleNotFoundError, match="label space 'fall11' needs imagenet22k_synsets.txt from the "
                                                      'timm package.*pip install timm'):
            synsets('in22k')
        assert num_classes('google21k') == 21843 and class_names('imagenet1k')[0].startswith('tench')
    finally:
        label_spaces.clear_cache()
