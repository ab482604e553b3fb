"""The fitted speed model in the form prediction needs: numpy arrays, no scikit-learn.

`model.SpeculationRegressor` fits (SciPy's least squares, scikit-learn's gradient boosting);
what it learns is a few dozen cost constants and some depth-2 regression trees per ensemble
member. `SpeedPredictor` holds exactly that and predicts with numpy alone, so `recommend`
with a kept fit never imports scikit-learn or SciPy (about 0.7 s of a 1.5 s command). It is
also what `train` and the fit cache keep on disk: a versioned JSON document.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, fields
from pathlib import Path
from statistics import NormalDist
from typing import Any

import numpy as np

from specreg.recommender.costmodel import CostParams, predict_tps
from specreg.recommender.features import TASK_SLOTS, column
from specreg.recommender.kshape import KShape

# Bump when the document's layout or the meaning of a field changes: older files are refitted.
PREDICTOR_FORMAT = "2"
JSON_KIND = "speed-model"

# Columns the residual trees see: facts that plausibly shift speed beyond the formulas.
RESIDUAL_FEATURES: tuple[str, ...] = (
    "target_params_b",
    "target_active_b",
    "target_bpw",
    "target_is_moe",
    "target_is_hybrid",
    "experts_ratio",
    "is_draft",
    "is_ngram",
    "ngram_n",
    "draft_params_b",
    "draft_bpw",
    "same_arch_family",
    "log_size_ratio",
    *(f"task_{t}" for t in TASK_SLOTS),
)


def residual_matrix(X: np.ndarray) -> np.ndarray:
    """The columns of feature rows `X` the residual model reads, in RESIDUAL_FEATURES order."""
    return np.column_stack([column(X, name) for name in RESIDUAL_FEATURES])


@dataclass(frozen=True, eq=False)
class ResidualTrees:
    """A boosted sum of regression trees: `init + rate * sum(tree(x))`, trees padded to one size.

    Arrays are (n_trees, n_nodes): `feature` and `threshold` of split nodes, `left`/`right`
    child indices (-1 at a leaf), `value` the leaf outputs. Splits compare float32 inputs, as
    scikit-learn's trees do, so predictions equal the fitted model's.
    """

    init: float
    rate: float
    feature: np.ndarray
    threshold: np.ndarray
    left: np.ndarray
    right: np.ndarray
    value: np.ndarray
    depth: int

    def predict(self, R: np.ndarray) -> np.ndarray:
        """The boosted sum for residual-feature rows `R` (see `residual_matrix`)."""
        x = np.asarray(R, dtype=np.float32).astype(float)
        n_trees, n_rows = self.feature.shape[0], x.shape[0]
        trees = np.arange(n_trees)[:, None]
        node = np.zeros((n_trees, n_rows), dtype=np.intp)
        rows = np.arange(n_rows)[None, :]
        for _ in range(self.depth):
            left = self.left[trees, node]
            go_left = x[rows, self.feature[trees, node]] <= self.threshold[trees, node]
            node = np.where(left < 0, node, np.where(go_left, left, self.right[trees, node]))
        return self.init + self.rate * self.value[trees, node].sum(axis=0)

    def to_json(self) -> dict[str, Any]:
        return {
            "init": self.init,
            "rate": self.rate,
            "depth": self.depth,
            **{k: getattr(self, k).tolist() for k in _TREE_ARRAYS},
        }

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> ResidualTrees:
        def ints(key: str) -> np.ndarray:
            return np.asarray(doc[key], dtype=np.intp)

        def floats(key: str) -> np.ndarray:
            return np.asarray(doc[key], dtype=float)

        trees = cls(
            init=float(doc["init"]),
            rate=float(doc["rate"]),
            feature=ints("feature"),
            threshold=floats("threshold"),
            left=ints("left"),
            right=ints("right"),
            value=floats("value"),
            depth=int(doc["depth"]),
        )
        shapes = {a.shape for a in (trees.feature, trees.threshold, trees.left, trees.right)}
        if len(shapes | {trees.value.shape}) != 1 or trees.value.ndim != 2:
            raise ValueError("residual trees: arrays of different shapes")
        return trees


_TREE_ARRAYS = ("feature", "threshold", "left", "right", "value")

# One ensemble member: cost constants and, optionally, the learned residual.
Member = tuple[CostParams, ResidualTrees | None]


def point(X: np.ndarray, params: CostParams, residual: ResidualTrees | None) -> np.ndarray:
    """Predicted tokens/s of one member: the cost model times exp(learned log-residual).

    The residual is what the cost formulas miss where they model a host's costs from its
    bandwidth (the prior's hosts); a row calibrated on this host (`specreg calibrate`) has its
    costs measured by llama-bench, so it keeps the cost model's figure."""
    tps, _ = predict_tps(X, params)
    if residual is not None:
        modelled = ~np.isfinite(column(X, "target_step_s"))
        tps = tps * np.where(modelled, np.exp(residual.predict(residual_matrix(X))), 1.0)
    return tps


@dataclass(frozen=True, eq=False)
class SpeedPredictor:
    """Predicts decode tokens/s of configurations (rows of `features.FEATURES`).

    params/residual: the full fit; members: the bootstrap refits, whose spread is the model
    uncertainty; noise: the scatter of single measurements (log tokens/s); band: the central
    probability of `predict_interval`; k_shape: the shape over K the training sweeps share
    (`kshape.sweep_shape`), None when it saw no sweeps.
    """

    params: CostParams
    residual: ResidualTrees | None
    members: tuple[Member, ...]
    noise: float
    band: float
    k_shape: KShape | None = None

    def predict(self, X: np.ndarray) -> np.ndarray:
        """Predicted decode tokens/s."""
        return point(np.asarray(X, dtype=float), self.params, self.residual)

    def predict_structural(self, X: np.ndarray) -> np.ndarray:
        """The cost model's prediction alone, without the learned residual."""
        return predict_tps(np.asarray(X, dtype=float), self.params)[0]

    def predict_acceptance(self, X: np.ndarray) -> np.ndarray:
        """Per-token acceptance probability (0 for plain decoding)."""
        return predict_tps(np.asarray(X, dtype=float), self.params)[1]

    def predict_log_sigma(self, X: np.ndarray) -> np.ndarray:
        """Standard deviation of log tokens/s: ensemble spread and measurement scatter."""
        X = np.asarray(X, dtype=float)
        spread = np.zeros(len(X))
        if self.members:
            logs = np.log([point(X, p, r) for p, r in self.members])
            spread = logs.std(axis=0)
        return np.sqrt(spread**2 + self.noise**2)

    def predict_interval(self, X: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(low, point, high) tokens/s; the band holds `band` of the probability."""
        mid = self.predict(X)
        z = NormalDist().inv_cdf(0.5 + self.band / 2)
        sigma = self.predict_log_sigma(X)
        return mid * np.exp(-z * sigma), mid, mid * np.exp(z * sigma)

    def with_params(self, **changes: Any) -> SpeedPredictor:
        """A copy with some cost constants replaced (what-if analysis)."""
        return dataclasses.replace(self, params=dataclasses.replace(self.params, **changes))

    # -- persistence ------------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        return {
            "version": PREDICTOR_FORMAT,
            "kind": JSON_KIND,
            "params": _params_json(self.params),
            "residual": self.residual.to_json() if self.residual else None,
            "members": [
                {"params": _params_json(p), "residual": r.to_json() if r else None}
                for p, r in self.members
            ],
            "noise": self.noise,
            "band": self.band,
            "k_shape": self.k_shape.to_json() if self.k_shape else None,
        }

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> SpeedPredictor:
        """The predictor of a `to_json` document; ValueError for another format or kind."""
        if doc.get("kind") != JSON_KIND or doc.get("version") != PREDICTOR_FORMAT:
            raise ValueError(
                f"not a speed model of format {PREDICTOR_FORMAT} "
                f"(kind {doc.get('kind')!r}, version {doc.get('version')!r})"
            )

        def trees(d: dict[str, Any] | None) -> ResidualTrees | None:
            return ResidualTrees.from_json(d) if d else None

        return cls(
            params=_params_of(doc["params"]),
            residual=trees(doc["residual"]),
            members=tuple((_params_of(m["params"]), trees(m["residual"])) for m in doc["members"]),
            noise=float(doc["noise"]),
            band=float(doc["band"]),
            k_shape=KShape.from_json(doc["k_shape"]) if doc.get("k_shape") else None,
        )

    def save(self, path: Path) -> None:
        write_json(path, self.to_json())

    @classmethod
    def load(cls, path: Path) -> SpeedPredictor:
        """OSError if unreadable; ValueError (or KeyError/TypeError) if not a speed model."""
        return cls.from_json(json.loads(path.read_text()))


def write_json(path: Path, doc: dict[str, Any]) -> None:
    """Write atomically: a reader never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(doc))
    tmp.replace(path)


def _params_json(p: CostParams) -> dict[str, Any]:
    return {f.name: getattr(p, f.name) for f in fields(p)}


def _params_of(doc: dict[str, Any]) -> CostParams:
    vec = np.concatenate(
        [np.ravel(np.asarray(doc[f.name], dtype=float)) for f in fields(CostParams)]
    )
    if len(vec) != len(CostParams().to_vector()):
        raise ValueError("cost constants: wrong number of values")
    return CostParams.from_vector(vec)
