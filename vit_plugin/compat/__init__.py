"""Every use of a private name of mmengine, mmcv, mmdet, mmpretrain, torch, torchvision, torch_xla or
numpy lives in this package, one module per dependency, each access with what it needs, why no public
way serves and the versions it was checked against (``tests/package/test_compat.py`` enforces this).

Two kinds of access are recorded:

- functions and names the rest of the package calls (``vit_plugin.compat.torch.version_counter``);
- private members of a dependency's class that one of our subclasses overrides or reads through
  ``self`` (a strategy's ``_wrap_model``). Those uses stay in the subclass, where Python needs them;
  the module's ``INHERITED`` lists each name with its owner and the classes (or class factories)
  allowed to use it, and the test checks that the owner still has it.

The modules import only their dependency, never another ``vit_plugin`` module, so any layer may use them.
"""
from typing import NamedTuple, Tuple


class Inherited(NamedTuple):
    """A private member of a dependency's class that our subclasses use.

    Attributes:
        owner (str): Where it is defined or set, ``module:Class`` (checked by the tests).
        users (tuple): ``module:Qualname`` of the vit_plugin classes or functions (a class factory)
            whose bodies may name it.
        why (str): What the subclass needs it for and why no public member serves.
    """

    owner: str
    users: Tuple[str, ...]
    why: str
