"""Trinity-RFT's checkpoint helper its FAQ uses to load a trained actor outside the framework."""

from __future__ import annotations

from pathlib import Path

import torch

from storage.convert import load_actor_state_dict


def load_fsdp_state_dict_from_verl_checkpoint(checkpoint_path: str) -> dict[str, torch.Tensor]:
    """The full state dict of an ``actor`` folder: veRL's FSDP shards
    (``model_world_size_W_rank_r.pt``), or this trainer's own shards or DeepSpeed checkpoint,
    ready for ``model.load_state_dict`` (what ``trinity convert`` writes as a Hugging Face folder)."""
    return load_actor_state_dict(Path(checkpoint_path))[0]
