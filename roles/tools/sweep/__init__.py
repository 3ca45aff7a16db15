"""``trinity sweep``: several LoRA runs that share one base model (one trainer, one engine)."""
