"""Every use of a private name of a dependency, one module per dependency (tests/package/test_compat.py).

Each access says what it needs, why no public way serves and the versions checked. ``INHERITED`` lists
private members our subclasses use through ``self``. The modules import only their dependency.
"""
from typing import NamedTuple, Tuple


class Inherited(NamedTuple):
    """A private member of a dependency's class that our subclasses use.

    Attributes:
        owner (str): Where it is defined, ``module:Class`` (checked by the tests).
        users (tuple): ``module:Qualname`` of the vit_plugin classes or factories that may name it.
        why (str): What it is needed for and why no public member serves.
    """

    owner: str
    users: Tuple[str, ...]
    why: str
