"""Small test helpers (``torch.testing.assert_close`` costs seconds on its first call here)."""

import torch


def assert_close(actual, expected, atol: float = 1e-9, rtol: float = 1e-7) -> None:
    """``actual`` equals ``expected`` (tensor or nested list) elementwise, compared in float64."""
    a = torch.as_tensor(actual).detach().double()
    e = torch.as_tensor(expected, dtype=torch.float64)
    assert a.shape == e.shape, f"shape {tuple(a.shape)} != {tuple(e.shape)}"
    assert torch.allclose(a, e, atol=atol, rtol=rtol), f"\n{a}\n!=\n{e}"
