"""Trinity-RFT's ``AlgorithmType``: a named set of default parts (``default_config()``), which
``ALGORITHM_TYPE.register_module`` adds to ours (``ops.algorithms.register_algorithm``), so
``algorithm.algorithm_type: <name>`` resolves and is checked like a built-in.

Here a critic, a reference model and where advantages are computed follow from the parts
(GAE needs a critic, a KL term a reference); a class that says otherwise is refused."""

from __future__ import annotations

from typing import Any


class AlgorithmType:
    use_critic: bool = False
    use_reference: bool = True
    compute_advantage_in_trainer: bool = False
    can_balance_batch: bool = True
    schema: str = "experience"

    @classmethod
    def default_config(cls) -> dict[str, Any]:
        return {}
