"""The interface of a module that turns incoming weights of another layout into its own as they load."""
import abc
from typing import Dict, List

import torch


class AdaptsIncomingWeights(abc.ABC):
    """A module that adapts the weights it is given (e.g. a classifier whose rows follow another label
    space, :class:`vit_plugin.models.heads.LabelSpaceClsHead`).

    The module calls :meth:`adapt_incoming_weights` from its own load-state-dict pre-hook, which covers
    ``init_cfg`` Pretrained, ``load_from``, ``--resume`` and ``load_state_dict``.
    :func:`vit_plugin.checkpoint.strict_load.fit_state_dict` compares shapes before anything loads, so
    it calls the method of every such module first. A second call finds nothing left to change.
    """

    @abc.abstractmethod
    def adapt_incoming_weights(self, state_dict: Dict[str, torch.Tensor], prefix: str) -> List[str]:
        """Adapt the ``prefix`` part of ``state_dict`` to this module, in place.

        Returns:
            list[str]: One message per change made (already logged).

        Raises:
            ValueError: weights this module cannot take, with what to set.
        """
