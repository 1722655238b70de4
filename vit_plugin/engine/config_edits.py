"""Changes to a config as data: each a key, its value before and after, and the plan step that made it."""
import copy
from dataclasses import dataclass
from typing import Any, Iterable, List, Tuple, Union

from mmengine.config import Config, ConfigDict

Key = Tuple[Union[str, int], ...]


class _Missing:
    """The value of a key that is absent (before it is added, or after it is removed)."""

    def __repr__(self) -> str:
        return '<absent>'

    def __deepcopy__(self, memo):
        return self


#: Stands for an absent key in :class:`Change`.
MISSING = _Missing()


def type_name(cfg_dict) -> str:
    """The class name of a config entry's ``type``, without its scope (``'vit_plugin.X'`` -> ``'X'``)."""
    return str((cfg_dict or {}).get('type', '') or '').split('.')[-1]


def plain(value):
    """``value`` with every dict a plain dict (config dicts print with their class name otherwise)."""
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(plain(v) for v in value)
    return value


def _config_value(value):
    if isinstance(value, dict):
        return ConfigDict({k: _config_value(v) for k, v in value.items()})
    if isinstance(value, list):
        return [_config_value(v) for v in value]
    return copy.deepcopy(value)


@dataclass(frozen=True)
class Change:
    """One key changed by a step; ``before`` / ``after`` are :data:`MISSING` when the key is added / removed."""
    step: str
    key: Key
    before: Any
    after: Any

    @property
    def path(self) -> str:
        return '.'.join(str(part) for part in self.key)

    def __str__(self) -> str:
        return f'{self.path}: {self.before!r} -> {self.after!r}'


class ConfigEdits:
    """A working copy of a config (``cfg`` is not modified) whose edits are recorded as :class:`Change` s."""

    def __init__(self, cfg):
        self.data = plain(cfg.to_dict() if hasattr(cfg, 'to_dict') else dict(cfg))
        self._original = copy.deepcopy(self.data)
        self._order: List[Tuple[str, Key]] = []
        self.step = ''

    # ------------------------------------------------------------------------------------ reading
    def get(self, key: Union[str, Key], default=None):
        """The working value at ``key`` (``'a.b'`` or a tuple with list indices), else ``default``."""
        node = self.data
        for part in self._key(key):
            try:
                node = node[part]
            except (KeyError, IndexError, TypeError):
                return default
        return node

    # ------------------------------------------------------------------------------------ editing
    def set(self, key: Union[str, Key], value) -> None:
        """Set ``key`` to ``value`` (intermediate dicts are created)."""
        key = self._key(key)
        node = self.data
        for part in key[:-1]:
            if isinstance(node, dict) and not isinstance(node.get(part), (dict, list)):
                node[part] = {}
            node = node[part]
        node[key[-1]] = plain(copy.deepcopy(value))
        self._record(key)

    def delete(self, key: Union[str, Key]) -> None:
        """Remove ``key`` if present."""
        key = self._key(key)
        parent = self.get(key[:-1]) if len(key) > 1 else self.data
        if isinstance(parent, dict) and key[-1] in parent:
            del parent[key[-1]]
            self._record(key)

    def update(self, key: Union[str, Key], new: dict) -> None:
        """Make the dict at ``key`` equal to ``new``, one changed or removed entry at a time."""
        key = self._key(key)
        old = self.get(key)
        if not isinstance(old, dict):
            self.set(key, new)
            return
        for name in list(old):
            if name not in new:
                self.delete(key + (name,))
        for name, value in new.items():
            if old.get(name, MISSING) != value:
                self.set(key + (name,), value)

    # ------------------------------------------------------------------------------------ result
    def changes(self) -> Tuple[Change, ...]:
        """The net changes, in the order their keys were first edited (a key set back to its value drops out)."""
        found = []
        for step, key in self._order:
            before, after = self._value(self._original, key), self._value(self.data, key)
            if before != after or type(before) is not type(after):
                found.append(Change(step, key, before, copy.deepcopy(after)))
        return tuple(found)

    @staticmethod
    def apply(cfg, changes: Iterable[Change]) -> None:
        """Apply ``changes`` to ``cfg`` (a :class:`~mmengine.config.Config`, in place)."""
        for change in changes:
            node = cfg
            for part in change.key[:-1]:
                if isinstance(node, (dict, Config)) and not isinstance(node.get(part), (dict, list)):
                    node[part] = ConfigDict()
                node = node[part]
            if change.after is MISSING:
                if isinstance(node, (dict, Config)) and change.key[-1] in node:
                    node.pop(change.key[-1])
            else:
                node[change.key[-1]] = _config_value(change.after)

    # ------------------------------------------------------------------------------------ helpers
    @staticmethod
    def _key(key) -> Key:
        return tuple(key.split('.')) if isinstance(key, str) else tuple(key)

    @staticmethod
    def _value(data, key: Key):
        node = data
        for part in key:
            try:
                node = node[part]
            except (KeyError, IndexError, TypeError):
                return MISSING
        return node

    def _record(self, key: Key) -> None:
        # An edit inside a key already recorded is part of that change, and a key recorded earlier
        # inside this one is replaced by it.
        if any(key[:len(seen)] == seen for _, seen in self._order):
            return
        self._order = [(step, seen) for step, seen in self._order if seen[:len(key)] != key]
        self._order.append((self.step, key))


__all__ = ['Change', 'ConfigEdits', 'MISSING', 'plain', 'type_name']
