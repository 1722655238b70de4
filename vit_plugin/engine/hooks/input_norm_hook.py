"""Runner hook: warn when loaded weights expect another input normalisation than the config's."""
from mmengine.hooks import Hook

from vit_plugin.models.input_norm import check_input_normalization
from vit_plugin.registry import HOOKS


@HOOKS.register_module()
class InputNormCheckHook(Hook):
    """Log each input-normalisation mismatch of the loaded weights once (before train, val, test).

    Runs :func:`~vit_plugin.models.input_norm.check_input_normalization`.
    """

    priority = 'VERY_LOW'

    def __init__(self):
        self._reported = set()

    def _check(self, runner) -> None:
        for message in check_input_normalization(runner.model, warn=False):
            if message not in self._reported:
                self._reported.add(message)
                runner.logger.warning(message)

    def before_train(self, runner) -> None:
        self._check(runner)

    def before_val(self, runner) -> None:
        self._check(runner)

    def before_test(self, runner) -> None:
        self._check(runner)


def use_input_norm_check(cfg) -> None:
    """Add :class:`InputNormCheckHook` to ``cfg.default_hooks`` unless the config names the key."""
    hooks = cfg.get('default_hooks')
    if hooks is None:
        cfg.default_hooks = hooks = {}
    if 'input_norm_check' not in hooks:
        hooks['input_norm_check'] = dict(type='vit_plugin.InputNormCheckHook')
