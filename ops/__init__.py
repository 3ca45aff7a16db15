"""The math: pure functions on tensors, no I/O.

Advantage functions, policy losses, KL penalties and losses, entropy and loss aggregation, and
reward functions, split the way Trinity-RFT splits an algorithm so one part can be swapped
without touching the others. ``algorithm_type`` picks a default for each part.
"""
