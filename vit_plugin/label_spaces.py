"""Label spaces: what each label index of an ImageNet head or data set means (docs/checkpoints.md#label-spaces)."""
import csv
import functools
import importlib.resources
import importlib.util
import re
from typing import Dict, Iterable, NamedTuple, Optional, Tuple

import numpy as np


class LabelSpaceError(ValueError):
    """An unknown label space, a label without counterpart, or synsets that do not form the space."""


class _Builtin(NamedTuple):
    file: Optional[str]  # in timm/data/_info/; None: built from the data
    num_classes: int


#: The label spaces this module knows by name, with their class counts.
BUILTIN_SPACES: Dict[str, _Builtin] = {
    'fall11': _Builtin('imagenet22k_synsets.txt', 21841),
    'google21k': _Builtin('imagenet21k_goog_synsets.txt', 21843),
    'winter21': _Builtin(None, 19167),  # no list installed anywhere: built from the synsets in the data
    'imagenet1k': _Builtin('imagenet_synsets.txt', 1000),
}

#: Other names of the spaces, compared without case, '-', '_' or spaces (timm's subset names included).
ALIASES: Dict[str, str] = {
    'imagenet22k': 'fall11', 'in22k': 'fall11', 'fall2011': 'fall11',
    'imagenet21kgoog': 'google21k', 'in21k': 'google21k', 'imagenet21k': 'google21k', 'goog21k': 'google21k',
    'imagenetw21': 'winter21', 'w21': 'winter21', 'winter2021': 'winter21',
    'in1k': 'imagenet1k', 'imagenet': 'imagenet1k', 'ilsvrc2012': 'imagenet1k',
}

_LEMMA_FILE = 'imagenet_synset_to_lemma.txt'
_SYNSET = re.compile(r'n\d{8}')

#: Spaces built from data (:func:`label_space_from_synsets`), by canonical name.
_REGISTERED: Dict[str, Tuple[str, ...]] = {}


def _key(name: str) -> str:
    return re.sub(r'[-_\s]', '', name.lower())


def _registered_name(name: str) -> str:
    key = _key(name)
    if key in BUILTIN_SPACES or key in ALIASES:
        return ALIASES.get(key, key)
    return next((registered for registered in _REGISTERED if _key(registered) == key), name)


def canonical_name(space: str) -> str:
    """The canonical name of ``space``, a name or an alias ('in22k' -> 'fall11'); LabelSpaceError if none."""
    if not isinstance(space, str):
        raise LabelSpaceError(f'a label space is named by a string, got {space!r}')
    key = _key(space)
    if key in BUILTIN_SPACES:
        return key
    if key in ALIASES:
        return ALIASES[key]
    for registered in _REGISTERED:
        if _key(registered) == key:
            return registered
    known = ', '.join(sorted(set(BUILTIN_SPACES) | set(_REGISTERED)))
    raise LabelSpaceError(f'unknown label space {space!r}; choose one of {known} (or an alias, e.g. in22k, in21k, '
                          f'in1k), or register one built from data with label_space_from_synsets')


def _timm_info(user: str, file: str) -> str:
    """The text of ``timm/data/_info/<file>``, read without importing timm."""
    spec = importlib.util.find_spec('timm')
    if spec is None:
        raise ModuleNotFoundError(f'{user} needs {file} from the timm package, which is not installed: '
                                  f'pip install timm')
    info = importlib.resources.files(importlib.util.module_from_spec(spec)) / 'data' / '_info' / file
    try:
        return info.read_text(encoding='utf-8')
    except FileNotFoundError:
        raise ModuleNotFoundError(f'{user} needs {file}, which the installed timm lacks (data/_info/); '
                                  f'pip install -U timm') from None


@functools.lru_cache(maxsize=None)
def _file_synsets(space: str) -> Tuple[str, ...]:
    builtin = BUILTIN_SPACES[space]
    found = tuple(_timm_info(f'label space {space!r}', builtin.file).split())
    if len(found) != builtin.num_classes or len(set(found)) != len(found):
        raise LabelSpaceError(f"timm's data/_info/{builtin.file} holds {len(found)} synsets ({len(set(found))} "
                              f'distinct), not the {builtin.num_classes} of label space {space!r}; reinstall timm')
    return found


def synsets(space: str) -> Tuple[str, ...]:
    """The WordNet ids of ``space`` in label order; raises LabelSpaceError (unknown, or ``'winter21'`` not yet
    built) or ModuleNotFoundError (the list comes from timm, not installed)."""
    name = canonical_name(space)
    if name in _REGISTERED:
        return _REGISTERED[name]
    if BUILTIN_SPACES[name].file is None:
        raise LabelSpaceError(f'label space {name!r} has no list installed anywhere; build it from the synsets of '
                              f'your data: vit_plugin.label_spaces.label_space_from_synsets(synsets, {name!r})')
    return _file_synsets(name)


def num_classes(space: str) -> int:
    """The number of classes of ``space`` (the documented count of a built-in space: no file is read)."""
    name = canonical_name(space)
    if name in _REGISTERED:
        return len(_REGISTERED[name])
    return BUILTIN_SPACES[name].num_classes


def spaces_of_size(count: int) -> Tuple[str, ...]:
    """The canonical names of the known spaces (built-in or registered) with ``count`` classes."""
    sizes = {name: b.num_classes for name, b in BUILTIN_SPACES.items()}
    sizes.update({name: len(s) for name, s in _REGISTERED.items()})
    return tuple(name for name, size in sizes.items() if size == count)


@functools.lru_cache(maxsize=None)
def _synset_index(name: str) -> Dict[str, int]:
    return {synset: i for i, synset in enumerate(synsets(name))}


def synset_index(space: str) -> Dict[str, int]:
    """Synset -> label of ``space`` (a new dict; the lookup behind it is cached)."""
    return dict(_synset_index(canonical_name(space)))


@functools.lru_cache(maxsize=None)
def _lemmas() -> Dict[str, str]:
    return dict(csv.reader(_timm_info('the class names of the 21k label spaces', _LEMMA_FILE).splitlines(),
                           delimiter='\t'))


@functools.lru_cache(maxsize=None)
def _class_names(name: str) -> Tuple[str, ...]:
    if name == 'imagenet1k':
        # mmpretrain's own list (the names its checkpoints and metrics use), so that ImageNet-1k works
        # without timm; its order is the sorted synsets'. onedl-mmpretrain 1.3.6 spells two entries
        # otherwise than WordNet's lemmas ('Ursus americans', 'confectionery, confectionery').
        from mmpretrain.datasets.categories import IMAGENET_CATEGORIES  # heavy: mmpretrain's datasets
        return tuple(IMAGENET_CATEGORIES)
    lemmas = _lemmas()
    # a synset of a space built from data may be missing from the lemma list: its id is its name
    return tuple(lemmas.get(synset, synset) for synset in synsets(name))


def class_names(space: str) -> Tuple[str, ...]:
    """Human-readable names of ``space`` in label order (WordNet lemmas; ImageNet-1k's from mmpretrain)."""
    return _class_names(canonical_name(space))


@functools.lru_cache(maxsize=None)
def _index_map(src: str, dst: str) -> np.ndarray:
    lookup = _synset_index(dst)
    found = np.fromiter((lookup.get(synset, -1) for synset in synsets(src)), dtype=np.int64,
                        count=num_classes(src))
    found.setflags(write=False)  # shared by every caller through the cache
    return found


def index_map(src: str, dst: str) -> np.ndarray:
    """int64 (``num_classes(src)``,) read-only: each label's label in ``dst``, -1 where ``dst`` lacks it."""
    return _index_map(canonical_name(src), canonical_name(dst))


def remap_labels(labels, src: str, dst: str, allow_missing: bool = False) -> np.ndarray:
    """Labels of ``src`` (any shape) as int64 labels of the same synsets in ``dst``; raises LabelSpaceError for
    a label outside ``src``, or one without counterpart unless ``allow_missing`` (-1)."""
    labels = np.asarray(labels)
    if labels.size and not np.issubdtype(labels.dtype, np.integer):
        raise LabelSpaceError(f'labels must be integers, got dtype {labels.dtype}')
    labels = labels.astype(np.int64, copy=False)
    mapping = index_map(src, dst)
    outside = (labels < 0) | (labels >= len(mapping))
    if outside.any():
        where = np.argwhere(outside)[0]
        raise LabelSpaceError(f'label {labels[tuple(where)]} at index {tuple(where.tolist())} is not a label of '
                              f'{canonical_name(src)!r}, which has {len(mapping)} classes (0..{len(mapping) - 1})')
    out = mapping[labels]
    missing = out < 0
    if missing.any() and not allow_missing:
        where = np.argwhere(missing)[0]
        label = int(labels[tuple(where)])
        raise LabelSpaceError(
            f'label {label} ({synsets(src)[label]}) of {canonical_name(src)!r} at index {tuple(where.tolist())} has '
            f'no counterpart in {canonical_name(dst)!r} ({int(missing.sum())} such labels); pass '
            f'allow_missing=True to map them to -1, or keep the data in {canonical_name(src)!r}')
    return out


def label_space_from_synsets(found: Iterable[str], name: str = 'winter21',
                             expected: Optional[int] = None) -> Tuple[str, ...]:
    """Register, under ``name``, the space of the sorted distinct synsets ``found``; returns it (idempotent).

    ``expected``: the count required (default 19,167 for ``'winter21'``, none for other names; 0: no check).
    Raises LabelSpaceError: no WordNet id, another count than ``expected``, or a name taken by another list."""
    canonical = _registered_name(name)
    builtin = BUILTIN_SPACES.get(canonical)
    if builtin is not None and builtin.file is not None:
        raise LabelSpaceError(f'label space {canonical!r} is read from timm\'s {builtin.file}; register the synsets '
                              f'of your data under another name')
    distinct = set(found)
    bad = sorted(s for s in distinct if not (isinstance(s, str) and _SYNSET.fullmatch(s)))
    if bad:
        raise LabelSpaceError(f'{bad[0]!r} is not a WordNet synset id (n + 8 digits, e.g. n01440764); '
                              f'{len(bad)} such value(s) among the synsets given for label space {name!r}')
    ordered = tuple(sorted(distinct))
    if expected is None and builtin is not None:
        expected = builtin.num_classes
    if expected and len(ordered) != expected:
        raise LabelSpaceError(f'the data holds {len(ordered)} distinct synsets, but label space {canonical!r} has '
                              f'{expected}: the data is incomplete or another release; pass expected=0 to accept it')
    if canonical in _REGISTERED and _REGISTERED[canonical] != ordered:
        raise LabelSpaceError(f'label space {canonical!r} is already registered with {len(_REGISTERED[canonical])} '
                              f'other synsets in this process; register these under another name')
    if not ordered:
        raise LabelSpaceError(f'no synsets given for label space {name!r}')
    _REGISTERED[canonical] = ordered
    return ordered


def clear_cache() -> None:
    """Forget every list read so far; spaces built from data stay registered."""
    for cached in (_file_synsets, _synset_index, _lemmas, _class_names, _index_map):
        cached.cache_clear()


def forget_label_space(name: str) -> None:
    """Remove a space registered by :func:`label_space_from_synsets`, with its caches.

    Raises LabelSpaceError if no such space was registered (built-ins cannot be removed)."""
    canonical = _registered_name(name)
    if canonical not in _REGISTERED:
        raise LabelSpaceError(f'no label space {name!r} was registered from data; nothing to forget')
    del _REGISTERED[canonical]
    clear_cache()
