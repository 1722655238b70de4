"""The stack the tests run on (docs/installation.md#two-stacks), and what only one stack has."""
import pytest

from vit_plugin.stack import stack_of_environment

STACK = stack_of_environment()

#: Why the torch_xla tests skip on the current stack: torch_xla's last release (2.9) needs torch 2.9.
XLA_SKIP_REASON = ('torch_xla belongs to the classic stack only (its last release needs torch 2.9); '
                   'run these tests with `STACK=classic make test`')


def import_torch_xla_or_skip_module():
    """torch_xla on the classic stack, where it is pinned (a missing one fails the module); on the current
    stack, which has none by design, skips the calling test module with :data:`XLA_SKIP_REASON`."""
    if STACK == 'current':
        pytest.skip(XLA_SKIP_REASON, allow_module_level=True)
    import torch_xla
    return torch_xla
