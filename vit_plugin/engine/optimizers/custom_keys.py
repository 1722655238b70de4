"""``paramwise_cfg.custom_keys`` that match no parameter path: one warning each naming the closest paths,
or an error under ``strict_custom_keys=True``. See docs/configs.md#one-runner-named-by-the-config.
"""
import difflib
import logging
from typing import Dict, Iterable, List, Optional

import torch.nn as nn
from mmengine.logging import print_log


class UnmatchedCustomKeyError(KeyError):
    """A ``paramwise_cfg.custom_keys`` entry matches no parameter (under ``strict_custom_keys=True``)."""

    def __str__(self) -> str:
        return str(self.args[0])


def parameter_paths(model: nn.Module) -> List[str]:
    """The strings mmengine matches custom keys against: ``'{module path}.{name}'`` of each parameter."""
    paths = []
    for module_name, module in model.named_modules():
        for name, _ in module.named_parameters(recurse=False):
            paths.append(f'{module_name}.{name}')
    return paths


def closest_paths(key: str, paths: Iterable[str], n: int = 3) -> List[str]:
    """Up to ``n`` parameter paths closest to ``key``, compared component by component."""
    parts = [part for part in key.split('.') if part]
    width = max(len(parts), 1)
    windows: Dict[str, str] = {}
    for path in paths:
        components = [part for part in path.split('.') if part]
        for start in range(max(len(components) - width + 1, 1)):
            window = '.'.join(components[start:start + width])
            windows.setdefault(window, '.'.join(components))
    found = difflib.get_close_matches('.'.join(parts), list(windows), n=n, cutoff=0.5)
    return [f'{window}{"..." if windows[window] != window else ""}' for window in found]


def check_custom_keys(model: nn.Module, optim_wrapper_cfg: Optional[dict]) -> List[str]:
    """Report each ``paramwise_cfg.custom_keys`` entry of ``optim_wrapper_cfg`` that matches no parameter of ``model``.

    Returns:
        list[str]: The keys that match nothing (each warned about).

    Raises:
        UnmatchedCustomKeyError: Under ``strict_custom_keys=True``, for the first such key.
    """
    paramwise = (optim_wrapper_cfg or {}).get('paramwise_cfg') or {}
    custom_keys = paramwise.get('custom_keys') or {}
    if not custom_keys:
        return []
    paths = parameter_paths(model)
    unmatched = [key for key in custom_keys if not any(key in path for path in paths)]
    for key in unmatched:
        close = closest_paths(key, paths)
        hint = f'closest parameter paths: {", ".join(close)}' if close else 'no parameter path is close'
        message = (f'optim_wrapper.paramwise_cfg.custom_keys[{key!r}] matches no parameter of '
                   f'{type(model).__name__} ({hint}).')
        if paramwise.get('strict_custom_keys'):
            raise UnmatchedCustomKeyError(f'{message} Rename or remove the key (strict_custom_keys=True).')
        print_log(f'{message} It changes nothing; paramwise_cfg.strict_custom_keys=True makes this an error.',
                  logger='current', level=logging.WARNING)
    return unmatched


__all__ = ['UnmatchedCustomKeyError', 'check_custom_keys', 'closest_paths', 'parameter_paths']
