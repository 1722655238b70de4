"""The interface of a module that turns incoming weights of another layout into its own as they load."""
import abc
from typing import Dict, List

import torch


class AdaptsIncomingWeights(abc.ABC):
    """A module adapting the weights it is given as they load; its pre-hook and the strict loader call
    :meth:`adapt_incoming_weights` (idempotent)."""

    @abc.abstractmethod
    def adapt_incoming_weights(self, state_dict: Dict[str, torch.Tensor], prefix: str) -> List[str]:
        """Adapt the ``prefix`` part of ``state_dict`` in place; returns the messages logged.

        Raises ValueError for weights this module cannot take, with what to set."""
