"""Task selectors: which rows of a taskset each step takes (Trinity-RFT's ``task_selector``).

A selector answers one question, ``pick(offset, n)``: the rows for the positions
``offset .. offset + n`` of its taskset's stream (``offset`` counts rows handed out since the
start, over all epochs). The reader (:class:`storage.tasksets.DatasetReader`) owns the offset;
the selector owns how rows are chosen and, for the adaptive one, what it has learned.

* :class:`OrderSelector`: ``sequential``, ``shuffle``, ``random`` and ``offline_easy2hard``. The
  rows of a position are a pure function of ``(seed, epoch, position)``, so the reader's offset
  is the whole state.
* :class:`DifficultySelector`: ``difficulty_based``, an online curriculum. It keeps a Beta
  estimate of each row's pass rate, fed by the per-task mean rewards that the buffer's
  ``pass_rate_calculator`` sends back over the bus, and picks the rows whose estimate is nearest
  ``target_reward``: for GRPO-style groups a row the model always or never solves teaches
  nothing (every advantage is 0), so the edge of what the model can do is where the signal is.
  A row it has not seen yet borrows its prior from rows like it (the same value of a
  ``feature_keys`` column, or all rows), so one pass rate moves the estimate of a whole level.
  Its state (the estimates) is saved with the cursor, so a resumed run picks exactly as the
  killed one would have.

Why not one class per Trinity-RFT name: four of the five are orders, and an order is data.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from storage.datafiles import TasksetError

ORDERS = ("sequential", "shuffle", "random", "offline_easy2hard")
#: ``difficulty_based`` kwargs and their defaults (Trinity-RFT's names and values).
DIFFICULTY_KWARGS: dict[str, Any] = {
    "target_reward": 1.0, "tau": 1.0, "do_sample": False, "m": 16, "lamb": 0.2, "rho": 0.2,
    "adaptive_rho": False,
}


class RowSelector(Protocol):
    """What a reader asks its selector."""

    kind: str

    def pick(self, offset: int, n: int) -> list[int]:
        """Rows for stream positions ``offset .. offset + n`` (no state changes)."""

    def update(self, indices: Sequence[int], values: Sequence[float]) -> None:
        """Feedback: the mean reward of each row in ``indices`` (ignored by orders)."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


def _features(rows: Sequence[dict[str, Any]], keys: Sequence[str], where: str) -> np.ndarray:
    """The ``keys`` columns as a float matrix (rows x keys); a missing or non-numeric value is
    an error naming the row and the key."""
    out = np.empty((len(rows), len(keys)), dtype=np.float64)
    for i, row in enumerate(rows):
        for j, k in enumerate(keys):
            v = row.get(k)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise TasksetError(f"{where}.feature_keys: row {i} has {k}={v!r}; a finite number is needed")
            out[i, j] = float(v)
    return out


class OrderSelector:
    """An order per epoch: file order, a seeded permutation, seeded draws with replacement, or
    the rows sorted by their features, largest first (Trinity-RFT's ``offline_easy2hard``:
    larger means easier, e.g. a reference model's pass rate)."""

    def __init__(self, kind: str, size: int, seed: int = 42, sort_by: np.ndarray | None = None) -> None:
        if kind not in ORDERS:
            raise TasksetError(f"task_selector.selector_type: unknown {kind!r} ({', '.join(ORDERS)}, difficulty_based)")
        self.kind, self.size, self.seed = kind, size, seed
        self._fixed: np.ndarray | None = None
        if kind == "offline_easy2hard":
            if sort_by is None or sort_by.shape[1] == 0:
                raise TasksetError("task_selector.feature_keys: offline_easy2hard sorts by them; name at least one column")
            # lexicographic, first key most significant, largest first; ties keep file order
            self._fixed = np.lexsort([np.arange(size)] + [-sort_by[:, j] for j in reversed(range(sort_by.shape[1]))])
        self._epoch, self._order = -1, np.empty(0, dtype=np.int64)

    def order(self, epoch: int) -> np.ndarray:
        """Rows of one epoch: a pure function of ``(kind, size, seed, epoch)``."""
        if self._fixed is not None:
            return self._fixed
        if self.kind == "sequential":
            return np.arange(self.size, dtype=np.int64)
        rng = np.random.default_rng([self.seed & 0xFFFFFFFF, epoch])
        if self.kind == "shuffle":
            return rng.permutation(self.size).astype(np.int64)
        return rng.integers(0, self.size, size=self.size, dtype=np.int64)

    def pick(self, offset: int, n: int) -> list[int]:
        out = []
        for off in range(offset, offset + n):
            epoch, pos = divmod(off, self.size)
            if epoch != self._epoch:
                self._epoch, self._order = epoch, self.order(epoch)
            out.append(int(self._order[pos]))
        return out

    def update(self, indices: Sequence[int], values: Sequence[float]) -> None:
        pass

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


class DifficultySelector:
    """``difficulty_based``: rows near ``target_reward`` by a Beta estimate of their pass rate.

    Per row: ``a``/``b``, observed successes and failures in units of rollouts (one feedback of
    mean reward ``r`` adds ``r * m`` and ``(1 - r) * m`` after fading the old ones by
    ``1 - lamb``: the model changes, so old results count less). The prior mean ``p0`` comes
    from the row's pool (rows sharing the value of the one ``feature_keys`` column, or all rows:
    a faded tally of the pass rates seen in it) or, with two feature columns, from Trinity-RFT's
    interpolation ``f0 + c * (f1 - f0)`` between a weak and a strong reference pass rate, ``c``
    the model's estimated capability. The estimate is ``Beta(a + k p0, b + k (1 - p0))`` with
    ``k = rho * m``: its mean, or a draw with ``do_sample`` (Thompson sampling). A pick scores
    rows by ``-|p - target_reward|`` and takes the best (``tau == 0``) or samples without
    replacement from ``softmax(score / tau)`` (Gumbel top-k), seeded by ``(seed, offset)``.
    """

    kind = "difficulty_based"

    def __init__(self, rows: Sequence[dict[str, Any]], feature_keys: Sequence[str],
                 kwargs: dict[str, Any], seed: int = 42, where: str = "task_selector") -> None:
        k = check_selector_config(self.kind, feature_keys, kwargs, where)
        self.size, self.seed = len(rows), seed
        self.target, self.tau, self.do_sample = float(k["target_reward"]), float(k["tau"]), bool(k["do_sample"])
        self.m, self.lamb, self.rho = float(k["m"]), float(k["lamb"]), float(k["rho"])
        self.adaptive_rho = bool(k["adaptive_rho"])
        feats = _features(rows, feature_keys, where)
        self.ref: np.ndarray | None = feats if len(feature_keys) == 2 else None
        if len(feature_keys) == 1:
            _, self.pool_of = np.unique(feats[:, 0], return_inverse=True)
        else:
            self.pool_of = np.zeros(self.size, dtype=np.int64)
        n_pools = int(self.pool_of.max()) + 1 if self.size else 1
        self.a = np.zeros(self.size)
        self.b = np.zeros(self.size)
        self.pool_s = np.zeros(n_pools)
        self.pool_f = np.zeros(n_pools)
        self.capability: float | None = None
        self.updates = 0

    # -- the estimate ------------------------------------------------------------------------

    def prior(self) -> np.ndarray:
        """Prior mean pass rate of every row."""
        if self.ref is not None:
            c = 0.0 if self.capability is None else self.capability
            return np.clip(self.ref[:, 0] + c * (self.ref[:, 1] - self.ref[:, 0]), 0.0, 1.0)
        return ((self.pool_s + 1.0) / (self.pool_s + self.pool_f + 2.0))[self.pool_of]

    def beta(self) -> tuple[np.ndarray, np.ndarray]:
        """The Beta parameters of every row's pass rate."""
        k = max(self.rho * self.m, 1e-3)
        p0 = self.prior()
        return self.a + k * p0, self.b + k * (1.0 - p0)

    def predicted(self, rng: np.random.Generator | None = None) -> np.ndarray:
        alpha, beta = self.beta()
        if self.do_sample and rng is not None:
            return rng.beta(alpha, beta)
        return alpha / (alpha + beta)

    def pick(self, offset: int, n: int) -> list[int]:
        rng = np.random.default_rng([self.seed & 0xFFFFFFFF, offset])
        out: list[int] = []
        while len(out) < n:  # more than the taskset holds: rounds without repeats inside one
            score = -np.abs(self.predicted(rng) - self.target)
            keys = score if self.tau == 0 else score / self.tau + rng.gumbel(size=self.size)
            tie = rng.permutation(self.size)  # equal scores: a seeded, fair order
            take = min(n - len(out), self.size)
            out += [int(i) for i in np.lexsort((tie, -keys))[:take]]
        return out

    def update(self, indices: Sequence[int], values: Sequence[float]) -> None:
        idx = np.asarray(indices, dtype=np.int64)
        r = np.clip(np.asarray(values, dtype=np.float64), 0.0, 1.0)
        if idx.size == 0:
            return
        if self.ref is not None:
            # the capability that would explain these pass rates between the two references
            f0, f1 = self.ref[idx, 0].mean(), self.ref[idx, 1].mean()
            c = (r.mean() - f0) / (f1 - f0 + 1e-6)
            self.capability = c if self.capability is None else 0.9 * self.capability + 0.1 * c
            if self.adaptive_rho and np.abs(self.prior()[idx] - r).mean() >= 0.25:
                self.rho *= 0.5  # the prior is far off: trust it less
        keep = 1.0 - self.lamb
        for i, v in zip(idx.tolist(), r.tolist(), strict=True):
            self.a[i] = keep * self.a[i] + v * self.m
            self.b[i] = keep * self.b[i] + (1.0 - v) * self.m
            p = self.pool_of[i]
            self.pool_s[p] = keep * self.pool_s[p] + v
            self.pool_f[p] = keep * self.pool_f[p] + (1.0 - v)
        self.updates += int(idx.size)

    # -- state -------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """The estimates, sparse (rows with feedback only); floats survive JSON exactly."""
        seen = np.flatnonzero((self.a > 0) | (self.b > 0))
        return {"rows": seen.tolist(), "a": self.a[seen].tolist(), "b": self.b[seen].tolist(),
                "pool_s": self.pool_s.tolist(), "pool_f": self.pool_f.tolist(),
                "capability": self.capability, "rho": self.rho, "updates": self.updates}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not state:
            return
        if len(state["pool_s"]) != len(self.pool_s):
            raise TasksetError(f"difficulty_based: saved state has {len(state['pool_s'])} pools, the taskset "
                               f"{len(self.pool_s)}; its feature column changed")
        self.a[:], self.b[:] = 0.0, 0.0
        rows = np.asarray(state["rows"], dtype=np.int64)
        self.a[rows], self.b[rows] = state["a"], state["b"]
        self.pool_s[:], self.pool_f[:] = state["pool_s"], state["pool_f"]
        self.capability, self.rho, self.updates = state["capability"], state["rho"], state["updates"]


#: ``difficulty_based`` kwargs that are numbers: the range each must be in, as (low, high,
#: whether low is allowed, whether high is allowed), and why. Outside it selection silently
#: degrades: a NaN or out-of-range ``target_reward`` scores every row alike (uniform
#: selection), a NaN ``tau`` makes every key NaN, an infinite ``m`` makes every estimate NaN.
DIFFICULTY_RANGES: dict[str, tuple[float, float, bool, bool, str]] = {
    "target_reward": (0.0, 1.0, True, True, "a pass rate: 0 <= target_reward <= 1"),
    "tau": (0.0, math.inf, True, False, "tau >= 0 (0: the best rows; > 0: softmax(score / tau))"),
    "m": (0.0, math.inf, False, False, "m > 0 (rollouts one feedback stands for)"),
    "lamb": (0.0, 1.0, True, False, "0 <= lamb < 1 (how much an old estimate fades)"),
    "rho": (0.0, math.inf, True, False, "rho >= 0 (the prior's weight, in units of m)"),
}


def check_selector_config(kind: str, feature_keys: Sequence[str], kwargs: dict[str, Any],
                          where: str = "task_selector") -> dict[str, Any]:
    """A ``task_selector``'s settings, checked without its data: the kwargs merged over their
    defaults, or :class:`TasksetError` naming the first bad one (``<where>.kwargs.tau: ...``).
    Every number must be finite and in its range (:data:`DIFFICULTY_RANGES`), the flags
    booleans, the feature columns as many as the selector reads. Run before any process starts
    (``roles/launch/checks.py``) and again when the selector is made."""
    if kind != "difficulty_based":
        if kwargs:
            raise TasksetError(f"{where}.kwargs: {kind} takes none, got {', '.join(sorted(kwargs))}")
        if kind == "offline_easy2hard" and not feature_keys:
            raise TasksetError(f"{where}.feature_keys: offline_easy2hard sorts by them; name at least one column")
        return {}
    unknown = sorted(set(kwargs) - set(DIFFICULTY_KWARGS))
    if unknown:
        raise TasksetError(f"{where}.kwargs: unknown {', '.join(unknown)} for difficulty_based "
                           f"(known: {', '.join(DIFFICULTY_KWARGS)})")
    if len(feature_keys) > 2:
        raise TasksetError(f"{where}.feature_keys: difficulty_based takes 0, 1 or 2 columns, got {len(feature_keys)}")
    k = {**DIFFICULTY_KWARGS, **kwargs}
    for name, (low, high, low_ok, high_ok, rule) in DIFFICULTY_RANGES.items():
        v = k[name]
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise TasksetError(f"{where}.kwargs.{name}: a number is needed, got {v!r}")
        inside = (low < v or (low_ok and v == low)) and (v < high or (high_ok and v == high))
        if not math.isfinite(v) or not inside:
            raise TasksetError(f"{where}.kwargs.{name}: got {v!r}; need {rule}")
    for name in ("do_sample", "adaptive_rho"):
        if not isinstance(k[name], bool):
            raise TasksetError(f"{where}.kwargs.{name}: true or false, got {k[name]!r}")
    return k


def make_selector(kind: str, rows: Sequence[dict[str, Any]], *, seed: int = 42,
                  feature_keys: Sequence[str] = (), kwargs: dict[str, Any] | None = None,
                  where: str = "task_selector") -> RowSelector:
    """The selector a ``task_selector`` section describes, over ``rows``."""
    if kind == "difficulty_based":
        return DifficultySelector(rows, feature_keys, kwargs or {}, seed, where)
    check_selector_config(kind, feature_keys, kwargs or {}, where)
    sort_by = _features(rows, feature_keys, where) if kind == "offline_easy2hard" else None
    return OrderSelector(kind, len(rows), seed, sort_by)
