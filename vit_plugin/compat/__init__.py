"""Every use of a private name of a dependency, one module per dependency, each importing only its own.

Rules and the ``INHERITED`` lists: docs/development.md#layout (tests/package/test_compat.py)."""
from typing import NamedTuple, Tuple


class Inherited(NamedTuple):
    """A private member of ``owner`` (``module:Class``) that ``users`` (``module:Qualname``) use, and ``why``."""

    owner: str
    users: Tuple[str, ...]
    why: str
