"""The trainer role: ``main.run_trainer`` (the loop), ``step`` (one update from ``ops``
losses), ``batch`` (padding, micro-batches), ``engine`` (PyTorch) and ``deepspeed_engine``."""
