"""The math: pure functions on tensors, no I/O.

Advantage functions, policy losses, KL penalties and losses, entropy and loss aggregation, and
reward functions, split the way Trinity-RFT splits an algorithm so one part can be swapped
without touching the others. ``algorithm_type`` picks a default for each part
(``ops.algorithms.resolve``); ``ops.registry`` maps the names used in configs to functions.

Modules: ``aggregation`` (masked reductions, ``aggregate_loss``), ``logits`` (log-probs and
entropy from logits), ``advantages``, ``policy_losses``, ``kl``, ``entropy``, ``rewards``,
``sampling`` (sample strategies), ``algorithms``, ``registry``. ``ops`` imports nothing from the project's other packages.
"""

# Importing the part modules registers the built-in parts under their config names.
# ``ops.algorithms`` is not imported here so that ``python -m ops.algorithms`` runs cleanly.
from ops import advantages, entropy, kl, policy_losses, rewards, sampling  # noqa: F401
from ops.registry import get, names, register

__all__ = ["get", "names", "register"]
