"""Changes trinity makes to a Hugging Face model config as it loads a model.

``model.rope_scaling`` / ``model.rope_theta`` (Trinity-RFT's names) reach the trainer, its
checkpoints and the rollout engines through :func:`override_rope`, applied to the config before
the weights load (and handed to vLLM as its ``hf_overrides``). Why a function of its own:
transformers 5 keeps RoPE settings in one ``rope_parameters`` dict (``rope_type``,
``rope_theta``, the scaling's ``factor``...), transformers 4 in ``rope_theta`` and
``rope_scaling`` attributes; one place knows both.
"""

from __future__ import annotations

from typing import Any


def override_rope(config: Any, rope_scaling: dict[str, Any] | None = None,
                  rope_theta: float | None = None) -> Any:
    """``config`` with the given RoPE settings (None: unchanged); returns it."""
    if rope_scaling is None and rope_theta is None:
        return config
    if hasattr(config, "rope_parameters"):  # transformers 5
        params = dict(config.rope_parameters or {})
        params.update(rope_scaling or {})
        if rope_theta is not None:
            params["rope_theta"] = float(rope_theta)
        config.rope_parameters = params
        return config
    if rope_scaling is not None:
        config.rope_scaling = dict(rope_scaling)
    if rope_theta is not None:
        config.rope_theta = float(rope_theta)
    return config
