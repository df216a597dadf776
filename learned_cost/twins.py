"""Measured twins: a group the training data timed is looked up, not guessed.

Many groups recur across graphs: the same LayerNorm, GEMM or conv-bn-relu on the same
shapes and dtype appears in several model families (the transformer blocks share their
shapes, the two conv-bn-relu families share their first layers), and a tuning run measures
more of them every day. For such a group the median of its measurements is closer to the
truth than any model of its features: identical groups timed in different graphs agree
far better than the held-out MLP predicts them (the noise-floor table of
docs/learned_cost.md sets the two side by side). So a correction with twins answers a
group whose feature vector it has seen with the median log-ratio measured for it, and
asks its model only about the rest.

A twin is an exact match of the feature vector (learned_cost.features: the descriptor's
ops, FLOPs and bytes, dtype, realization and the device spec's figures), rounded to
`DECIMALS` so the same group reached from a dataset row or from a captured graph keys
alike. Another device spec (other peaks) changes the features, so a table never answers
for a device it was not measured on.

The online bias (learned_cost/online.py) moves a twin's answer as it moves the networks':
it tracks what differs between the machine that measured and the one tuning now, which
applies to both. The table itself grows only with a refit.

The table is plain arrays (feature rows, median log-ratios, counts): it persists in the
model's .npz beside the weights, with no pickle.
"""

from __future__ import annotations

import numpy as np

from planner.errors import CostModelError

DECIMALS = 6  # features are logs and small counts: 1e-6 tells groups apart, not float noise


def _key(row: np.ndarray) -> bytes:
    return np.round(np.asarray(row, dtype=np.float64), DECIMALS).tobytes()


class TwinTable:
    """Median measured log-ratio per distinct feature vector of the rows it was built on."""

    def __init__(self, keys: np.ndarray, values: np.ndarray, counts: np.ndarray):
        keys = np.asarray(keys, dtype=np.float64)
        values = np.asarray(values, dtype=np.float64).reshape(-1)
        counts = np.asarray(counts, dtype=np.int64).reshape(-1)
        if keys.ndim != 2 or not (len(keys) == len(values) == len(counts)):
            raise CostModelError(
                f"a twin table needs one feature row, value and count per entry; got keys "
                f"{keys.shape}, values {values.shape}, counts {counts.shape}"
            )
        self.keys, self.values, self.counts = keys, values, counts
        self._index = {_key(k): i for i, k in enumerate(keys)}

    @classmethod
    def fit(cls, X: np.ndarray, y: np.ndarray) -> TwinTable:
        """One entry per distinct row of X: the median of its targets y and how many."""
        X = np.asarray(X, dtype=np.float64)
        y = np.asarray(y, dtype=np.float64).reshape(-1)
        if len(X) != len(y):
            raise CostModelError(f"{len(X)} feature rows for {len(y)} targets")
        groups: dict[bytes, list[int]] = {}
        for i, row in enumerate(X):
            groups.setdefault(_key(row), []).append(i)
        idx = list(groups.values())
        n_features = X.shape[1] if X.ndim == 2 else 0
        keys = (
            np.vstack([np.round(X[v[0]], DECIMALS) for v in idx])
            if idx
            else np.zeros((0, n_features))
        )
        values = np.array([float(np.median(y[v])) for v in idx])
        return cls(keys, values, np.array([len(v) for v in idx]))

    def __len__(self) -> int:
        return len(self.values)

    def lookup(self, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(values, hit): the twin's median log-ratio per row of X (nan where none) and
        whether the row has a twin."""
        X = np.asarray(X, dtype=np.float64)
        found = [self._index.get(_key(row), -1) for row in X]
        hit = np.array([i >= 0 for i in found], dtype=bool)
        values = np.full(len(X), np.nan)
        if hit.any():
            values[hit] = self.values[[i for i in found if i >= 0]]
        return values, hit

    def answer(self, X: np.ndarray, predicted: np.ndarray) -> np.ndarray:
        """`predicted` (log-ratios, one per row of X) with every row that has a twin
        answered by the twin's median instead (a new array)."""
        out = np.array(predicted, dtype=np.float64)
        measured, hit = self.lookup(X)
        out[hit] = measured[hit]
        return out

    def arrays(self, prefix: str = "twins.") -> dict[str, np.ndarray]:
        return {
            f"{prefix}keys": self.keys,
            f"{prefix}values": self.values,
            f"{prefix}counts": self.counts.astype(np.float64),
        }

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray], prefix: str = "twins.") -> TwinTable:
        return cls(arrays[f"{prefix}keys"], arrays[f"{prefix}values"], arrays[f"{prefix}counts"])
