"""An MLP (torch) that predicts ln(measured / analytical) for a group: the learned correction.

Three forms, chosen by the `form` hyper-parameter:

- "free": the network's one output is the log-ratio itself. Nothing stops it from
  predicting a group faster than the roofline allows.
- "roofline": NeuSight-style (ASPLOS'25): the network predicts the *fraction of each
  roof* the group reaches, u_c, u_m in (0, 1) (sigmoids), and a launch multiplier k > 0:
      T = max(T_compute / u_c, T_memory / u_m) + k * T_launch.
  The roofline part can never beat the device's peaks; only the launch term, which is an
  estimate in the spec, is free. The output is still reported as ln(T / T_analytical).
- "mixed": `n_members` networks of each of the two forms, their log-ratios averaged. The
  free form is the closer on the groups of a seen family, the roofline form the safer
  where the network must extrapolate; their errors differ: on H100 groups of held-out
  families the mean is closer than either, on held-out plans about as close as the free
  form, with a lower regret (docs/learned_cost.md, docs/design_notes.md). Its networks are those
  the two forms fit with the same seeds, so `mixed_of(free, roofline)` builds it from
  the two fitted models without fitting again.

Both read the same feature matrix (learned_cost.features.FEATURE_NAMES order); the
roofline form takes the raw analytical parts back out of the T_* columns.

Estimator contract (scikit-learn's, without importing it: the runtime path stays light):
hyper-parameters in `__init__` and nothing else; `fit` returns self and replaces an earlier
fit; learned state ends in `_`, `n_features_in_` among it; `predict` before `fit` raises
NotFittedCostModelError (a ValueError and AttributeError, as scikit-learn's NotFittedError);
bad data (not 2-D, NaN/inf, sparse, complex, the wrong width) raises CostModelInputError (a
ValueError); a column-vector y is taken as 1-D; `random_state` makes a fit reproducible.
The free form fits a matrix of any width; the forms that read the analytical parts back
need the FEATURE_NAMES columns. tests/test_sklearn_checks.py runs scikit-learn's estimator
checks and names those that do not apply.
"""

from __future__ import annotations

import copy
import inspect
import math
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from learned_cost.features import FEATURE_NAMES, PART_FEATURES
from learned_cost.twins import TwinTable
from planner.errors import CostModelError, CostModelInputError, NotFittedCostModelError
from planner.hardware import one_thread

FORMS = ("free", "roofline", "mixed")
NET_FORMS = ("free", "roofline")  # the forms of single networks; "mixed" holds both
LOSSES = ("huber", "ape")
_LN10 = math.log(10.0)


def _network(n_in: int, hidden: tuple[int, ...], n_out: int, dropout: float) -> nn.Sequential:
    """Linear -> SiLU -> Dropout per hidden layer, then a linear output layer."""
    layers: list[nn.Module] = []
    width = n_in
    for h in hidden:
        layers += [nn.Linear(width, h), nn.SiLU(), nn.Dropout(dropout)]
        width = h
    layers.append(nn.Linear(width, n_out))
    return nn.Sequential(*layers)


def _n_out(form: str) -> int:
    """Outputs of one network: the log-ratio (free), or u_c, u_m and k (roofline)."""
    return 1 if form == "free" else 3


def _member_prefix(j: int) -> str:
    """Saved array names of ensemble member j: "net.<param>" for the first (so a model
    saved before ensembles, one network, loads unchanged), "net<j>.<param>" after."""
    return "net." if j == 0 else f"net{j}."


def _net_numpy(weights: list[tuple[np.ndarray, np.ndarray]], h: np.ndarray) -> np.ndarray:
    """`_network` in numpy (float64), from its Linear layers' (W^T, b): a search loop scores
    groups a few at a time, where torch's per-call overhead would cost more than the net."""
    for k, (w, b) in enumerate(weights):
        h = h @ w + b
        if k < len(weights) - 1:
            h = h / (1.0 + np.exp(-h))  # SiLU, as in _network
    return h


class CorrectionMLP:
    """Predicts ln(measured / analytical) of a group from its features.

    Hyper-parameters: `form` ("free" | "roofline" | "mixed"), `hidden` layer widths,
    `steps` (gradient steps in all, whatever the data size: small datasets need as many
    steps as big ones), `lr` (AdamW, cosine-annealed), `weight_decay`, `dropout` (after each hidden layer:
    with a few thousand rows from a handful of model families the network otherwise
    memorizes family quirks and extrapolates badly to an unseen family), `batch_size`
    (full batch when the data is smaller),
    `loss`: "huber" (Huber on the log-ratio, `huber_delta` wide, so a few noisy timings do
    not dominate) or "ape" (the absolute percentage error |pred / measured - 1| itself, the
    metric the model is judged by: where timings of one group scatter, it settles on the
    lower mode rather than the log-mean), `n_members` (an ensemble of that many networks,
    each with its own seed and batch order, whose log-ratios are averaged: one network's
    held-out MAPE moves by about a point from seed to seed on these datasets; "mixed"
    fits that many of each form),
    `clip_margin` (predictions are clipped to the training targets' range widened by this
    many nats: an extrapolating network must not send the search off to
    groups that look 100x cheaper than anything it saw), `twins` (a group whose feature
    vector the training rows hold is answered with their median measured log-ratio, the
    networks only asked about the rest: learned_cost/twins.py), `random_state`.
    """

    def __init__(
        self,
        *,
        form: str = "free",
        hidden: tuple[int, ...] = (64, 64),
        steps: int = 3000,
        lr: float = 3e-3,
        weight_decay: float = 1e-4,
        dropout: float = 0.3,
        batch_size: int = 256,
        huber_delta: float = 0.5,
        loss: str = "huber",
        n_members: int = 3,
        clip_margin: float = 1.0,
        twins: bool = False,
        random_state: int = 0,
    ):
        self.form = form
        self.hidden = hidden
        self.steps = steps
        self.lr = lr
        self.weight_decay = weight_decay
        self.dropout = dropout
        self.batch_size = batch_size
        self.huber_delta = huber_delta
        self.loss = loss
        self.n_members = n_members
        self.clip_margin = clip_margin
        self.twins = twins
        self.random_state = random_state

    # ---- scikit-learn style parameters ---------------------------------------------------
    def get_params(self, deep: bool = True) -> dict[str, Any]:
        names = [p for p in inspect.signature(type(self).__init__).parameters if p != "self"]
        return {n: getattr(self, n) for n in names}

    def set_params(self, **params: Any) -> CorrectionMLP:
        valid = self.get_params()
        for k, v in params.items():
            if k not in valid:
                raise CostModelError(
                    f"CorrectionMLP has no hyper-parameter {k!r}; it has {list(valid)}"
                )
            setattr(self, k, v)
        return self

    # scikit-learn reads these to treat the model as a regressor (is_regressor,
    # cross_val_score's default scoring, clone, check_is_fitted); it is imported only by
    # scikit-learn's own callers, never on the serving path.
    _estimator_type = "regressor"  # what scikit-learn < 1.6 reads

    def __sklearn_tags__(self) -> Any:
        from sklearn.utils import InputTags, RegressorTags, Tags, TargetTags

        return Tags(
            estimator_type="regressor",
            target_tags=TargetTags(required=True, one_d_labels=True),
            regressor_tags=RegressorTags(),
            input_tags=InputTags(two_d_array=True),
        )

    def __sklearn_is_fitted__(self) -> bool:
        return self.is_fitted

    def score(self, X: np.ndarray, y: np.ndarray) -> float:
        """R^2 of `predict(X)` against the log-ratios `y` (scikit-learn's regressor score)."""
        y = np.asarray(y, dtype=np.float64).ravel()
        resid = float(np.sum((y - self.predict(X)) ** 2))
        total = float(np.sum((y - y.mean()) ** 2))
        return 1.0 - resid / total if total > 0 else (1.0 if resid == 0 else 0.0)

    def __repr__(self) -> str:
        return (
            f"CorrectionMLP(form={self.form!r}, hidden={self.hidden}, steps={self.steps}, "
            f"loss={self.loss!r}, n_members={self.n_members}, twins={self.twins})"
        )

    @property
    def is_fitted(self) -> bool:
        return hasattr(self, "nets_")

    # ---- fitting ----------------------------------------------------------------------
    def fit(self, X: np.ndarray, y: np.ndarray) -> CorrectionMLP:
        """Fit on features X (n, len(FEATURE_NAMES)) and targets y = ln(measured/analytical)."""
        if self.form not in FORMS:
            raise CostModelError(f"form must be one of {FORMS}, got {self.form!r}")
        if self.loss not in LOSSES:
            raise CostModelError(f"loss must be one of {LOSSES}, got {self.loss!r}")
        if int(self.n_members) < 1:
            raise CostModelError(f"n_members must be at least 1, got {self.n_members!r}")
        X, y = self._check_X(X, fitting=True), self._check_y(y)
        if len(X) != len(y) or len(y) < 2:
            raise CostModelInputError(
                f"fit needs at least 2 rows (samples) and as many targets as rows; got X "
                f"{X.shape} ({len(X)} sample{'s' if len(X) != 1 else ''}), y {y.shape}"
            )
        self.scaler_mean_ = X.mean(axis=0)
        scale = X.std(axis=0)
        self.scaler_scale_ = np.where(scale > 1e-8, scale, 1.0)
        self.y_min_, self.y_max_ = float(y.min()), float(y.max())
        self.feature_names_ = FEATURE_NAMES if X.shape[1] == len(FEATURE_NAMES) else None
        self.n_features_in_ = X.shape[1]
        self.nets_: list[nn.Sequential] = []
        self._weights = None
        losses = []
        with torch.random.fork_rng(devices=[]), one_thread():
            for j, form in enumerate(self.net_forms()):
                seed = self.random_state + 1000 * (j % int(self.n_members))  # as each form's
                torch.manual_seed(seed)  # own model seeds it: member 0 is the single network
                net = _network(X.shape[1], tuple(self.hidden), _n_out(form), self.dropout)
                self._init_output(net, y, form)
                losses.append(
                    self._train(net, X, y, net.parameters(), self.steps, self.lr, seed, form)
                )
                self.nets_.append(net)
        self.train_loss_ = float(np.mean(losses))
        self._fit_twins(X, y)
        self._numpy_weights()  # made now, so predicting leaves the fitted state as it is
        return self

    def _fit_twins(self, X: np.ndarray, y: np.ndarray) -> None:
        if self.twins:
            self.twins_ = TwinTable.fit(X, y)
        elif hasattr(self, "twins_"):
            del self.twins_  # a refit without twins forgets an earlier table

    def with_twins(self, X: np.ndarray, y: np.ndarray) -> CorrectionMLP:
        """A copy of this fitted model with `twins=True` and its table built from the rows
        it was fitted on (X, y): what fitting with twins on those rows gives, without
        training the networks again."""
        self._require_fit()
        model = copy.deepcopy(self)
        model.twins = True
        model._fit_twins(self._check_X(X), self._check_y(y))
        return model

    def net_forms(self) -> list[str]:
        """The form of each network, in order: n_members of the form, or for "mixed"
        n_members free networks then n_members roofline ones."""
        forms = NET_FORMS if self.form == "mixed" else (self.form,)
        return [f for f in forms for _ in range(int(self.n_members))]

    @classmethod
    def mixed_of(cls, free: CorrectionMLP, roofline: CorrectionMLP) -> CorrectionMLP:
        """The "mixed" model of a fitted free and a fitted roofline model with the same
        other hyper-parameters, fitted on the same rows: what fitting form="mixed" on those
        rows gives (the same networks, seed for seed), without fitting again."""
        free._require_fit()
        roofline._require_fit()
        a, b = free.get_params(), roofline.get_params()
        if (a.pop("form"), b.pop("form")) != ("free", "roofline") or a != b:
            raise CostModelError(
                "mixed_of needs a free and a roofline model with the same other "
                f"hyper-parameters; got {free!r} and {roofline!r}"
            )
        same_rows = (
            np.array_equal(free.scaler_mean_, roofline.scaler_mean_)
            and np.array_equal(free.scaler_scale_, roofline.scaler_scale_)
            and (free.y_min_, free.y_max_) == (roofline.y_min_, roofline.y_max_)
        )
        if not same_rows:
            raise CostModelError("mixed_of: the two models were fitted on different rows")
        model = cls(**{**a, "form": "mixed"})
        # copies: an online update of one model must not move the others' networks
        model.nets_ = [copy.deepcopy(n) for n in (*free.nets_, *roofline.nets_)]
        model._weights = None
        model._numpy_weights()
        model.scaler_mean_, model.scaler_scale_ = free.scaler_mean_, free.scaler_scale_
        model.y_min_, model.y_max_ = free.y_min_, free.y_max_
        model.feature_names_, model.n_features_in_ = free.feature_names_, free.n_features_in_
        model.train_loss_ = float(np.mean([free.train_loss_, roofline.train_loss_]))
        if hasattr(free, "twins_"):  # both parts hold the table of the same rows
            model.twins_ = copy.deepcopy(free.twins_)
        return model

    def _init_output(self, net: nn.Sequential, y: np.ndarray, form: str) -> None:
        """Start near the data: the free form at the mean log-ratio, the roofline form at
        half of each roof and the launch multiplier that explains the median residual."""
        last = net[-1]
        assert isinstance(last, nn.Linear)
        with torch.no_grad():
            last.weight.mul_(0.1)
            if form == "free":
                last.bias.fill_(float(np.mean(y)))
            else:
                last.bias.copy_(torch.tensor([0.0, 0.0, max(float(np.median(y)), 0.0)]))

    def _train(
        self,
        net: nn.Sequential,
        X: np.ndarray,
        y: np.ndarray,
        params: Any,
        steps: int,
        lr: float,
        seed: int,
        form: str,
        dropout: bool = True,
    ) -> float:
        """`steps` AdamW steps of `net` on shuffled mini-batches; returns the last batch's
        loss. `dropout=False` keeps the network in eval mode (fine-tuning the last layer)."""
        xt = torch.as_tensor(self._scale(X), dtype=torch.float32)
        # the free form reads no parts: it fits a matrix of any width
        parts = torch.as_tensor(
            self._parts(X) if form == "roofline" else np.zeros((len(X), 3)), dtype=torch.float32
        )
        yt = torch.as_tensor(y, dtype=torch.float32)
        opt = torch.optim.AdamW(list(params), lr=lr, weight_decay=self.weight_decay)
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=max(steps, 1))
        gen = torch.Generator().manual_seed(seed)
        n = len(yt)
        bs = min(self.batch_size, n)
        order, pos = torch.randperm(n, generator=gen), 0
        loss_value = float("nan")
        net.train(dropout)
        for _ in range(steps):
            if pos + bs > n:
                order, pos = torch.randperm(n, generator=gen), 0
            idx = order[pos : pos + bs]
            pos += bs
            loss = self._loss(self._forward_one(net, xt[idx], parts[idx], form), yt[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
            loss_value = float(loss.detach())
        net.eval()
        return loss_value

    def _loss(self, pred: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if self.loss == "ape":
            # |exp(pred - y) - 1| = |predicted / measured - 1|; the exponent is bounded so
            # an untrained network's first steps cannot overflow.
            return (torch.exp(torch.clamp(pred - y, max=5.0)) - 1.0).abs().mean()
        return F.huber_loss(pred, y, delta=self.huber_delta)

    def partial_fit(
        self, X: np.ndarray, y: np.ndarray, *, steps: int = 5, lr: float = 1e-3
    ) -> CorrectionMLP:
        """A few gradient steps on the last layer only, from new measurements (the
        online refinement of docs/formulas.md §13): cheap, and the features' scaling is kept
        as fitted."""
        self._require_fit()
        X, y = self._check_X(X), self._check_y(y)
        if len(X) != len(y):
            raise CostModelInputError(
                f"partial_fit needs as many targets as rows; got X {X.shape}, y {y.shape}"
            )
        if len(y) == 0 or steps <= 0:
            return self
        with torch.random.fork_rng(devices=[]), one_thread():
            torch.manual_seed(self.random_state)
            for net, form in zip(self.nets_, self.net_forms()):
                self._train(
                    net,
                    X,
                    y,
                    net[-1].parameters(),
                    steps,
                    lr,
                    self.random_state,
                    form,
                    dropout=False,
                )
        self._weights = None
        self._numpy_weights()
        self.y_min_ = min(self.y_min_, float(y.min()))
        self.y_max_ = max(self.y_max_, float(y.max()))
        return self

    def fine_tune(
        self, X: np.ndarray, y: np.ndarray, *, steps: int, lr: float, last_only: bool = False
    ) -> CorrectionMLP:
        """`steps` gradient steps on every network, from its fitted weights (all layers, in
        training mode, or the output layer alone in eval mode): a model trained on one
        device, moved to another from a few of its rows (learned_cost/adapt.py). The
        features' scaling is kept as fitted; the trusted range grows to the new targets."""
        self._require_fit()
        X, y = self._check_X(X), self._check_y(y)
        if len(X) != len(y):
            raise CostModelInputError(
                f"fine_tune needs as many targets as rows; got X {X.shape}, y {y.shape}"
            )
        if len(y) == 0 or steps <= 0:
            return self
        with torch.random.fork_rng(devices=[]), one_thread():
            torch.manual_seed(self.random_state)
            for j, (net, form) in enumerate(zip(self.nets_, self.net_forms())):
                params = net[-1].parameters() if last_only else net.parameters()
                seed = self.random_state + 1000 * j
                self._train(net, X, y, params, steps, lr, seed, form, dropout=not last_only)
        self._weights = None
        self._numpy_weights()
        self.y_min_ = min(self.y_min_, float(y.min()))
        self.y_max_ = max(self.y_max_, float(y.max()))
        return self

    # ---- prediction -------------------------------------------------------------------
    def predict(self, X: np.ndarray) -> np.ndarray:
        """ln(predicted / analytical) for each row of X (the members' mean), clipped to the
        trusted range; with twins, a row whose features were measured gets their median
        instead. Runs in numpy (float64) from the fitted weights (`_net_numpy`)."""
        self._require_fit()
        X = self._check_X(X)
        h = self._scale(X)
        rs = []
        for weights, form in zip(self._numpy_weights(), self.net_forms()):
            z = _net_numpy(weights, h)
            if form == "free":
                rs.append(z[:, 0])
                continue
            ln_tc, ln_tm, ln_tl = (self._parts(X)[:, i] * _LN10 for i in range(3))
            roof = np.maximum(
                ln_tc + np.logaddexp(0.0, -z[:, 0]), ln_tm + np.logaddexp(0.0, -z[:, 1])
            )
            ln_pred = np.logaddexp(roof, ln_tl + z[:, 2])
            rs.append(ln_pred - np.logaddexp(np.maximum(ln_tc, ln_tm), ln_tl))
        lo, hi = self.y_min_ - self.clip_margin, self.y_max_ + self.clip_margin
        r = np.clip(np.mean(rs, axis=0), lo, hi)
        if getattr(self, "twins_", None) is not None:
            r = self.twins_.answer(X, r)
        return r

    def predict_fractions(self, X: np.ndarray) -> np.ndarray:
        """Roofline networks only: (u_compute, u_memory, k_launch) per row, for inspection
        (the roofline members' mean, in log space)."""
        self._require_fit()
        if self.form not in ("roofline", "mixed"):
            raise CostModelError("predict_fractions needs form='roofline' (or 'mixed')")
        h = self._scale(self._check_X(X))
        out = []
        for weights, form in zip(self._numpy_weights(), self.net_forms()):
            if form != "roofline":
                continue
            z = _net_numpy(weights, h)
            out.append(np.column_stack([-np.logaddexp(0.0, -z[:, :2]), z[:, 2]]))
        return np.exp(np.mean(out, axis=0))

    def _numpy_weights(self) -> list[list[tuple[np.ndarray, np.ndarray]]]:
        """numpy copies of the members' weights, made on first use after a fit or update."""
        if getattr(self, "_weights", None) is None:
            self._weights = [
                [
                    (m.weight.detach().double().numpy().T.copy(), m.bias.detach().double().numpy())
                    for m in net
                    if isinstance(m, nn.Linear)
                ]
                for net in self.nets_
            ]
        return self._weights

    def _forward(self, xt: torch.Tensor, parts: torch.Tensor) -> torch.Tensor:
        """The ensemble's log-ratio (members averaged), as `predict` computes it unclipped."""
        return torch.stack(
            [self._forward_one(n, xt, parts, f) for n, f in zip(self.nets_, self.net_forms())]
        ).mean(0)

    @staticmethod
    def _forward_one(
        net: nn.Sequential, xt: torch.Tensor, parts: torch.Tensor, form: str
    ) -> torch.Tensor:
        z = net(xt)
        if form == "free":
            return z[:, 0]
        ln_tc, ln_tm, ln_tl = (parts[:, i] * _LN10 for i in range(3))
        roof = torch.maximum(ln_tc - F.logsigmoid(z[:, 0]), ln_tm - F.logsigmoid(z[:, 1]))
        ln_pred = torch.logaddexp(roof, ln_tl + z[:, 2])
        ln_analytical = torch.logaddexp(torch.maximum(ln_tc, ln_tm), ln_tl)
        return ln_pred - ln_analytical

    # ---- helpers ----------------------------------------------------------------------
    def _require_fit(self) -> None:
        if not self.is_fitted:
            raise NotFittedCostModelError(
                "CorrectionMLP is not fitted: call fit(X, y) first, or load a trained model "
                "with learned_cost.persist.load_model"
            )

    def _check_X(self, X: Any, *, fitting: bool = False) -> np.ndarray:
        """X as a finite float64 matrix. `fit` takes a 2-D matrix: any width for the free
        form, the FEATURE_NAMES columns for the forms that read the analytical parts back;
        the other methods take the fitted width."""
        if type(X).__module__.startswith("scipy.sparse"):
            raise CostModelInputError(
                "sparse input is not supported: pass a dense feature matrix (X.toarray())"
            )
        X = np.asarray(X)
        if np.iscomplexobj(X):
            raise CostModelInputError("Complex data not supported: features are real numbers")
        try:
            X = X.astype(np.float64)
        except (TypeError, ValueError) as e:
            raise CostModelInputError(f"features must be numbers: {e}") from e
        if X.ndim != 2:
            raise CostModelInputError(
                f"expected a 2-D feature matrix (rows x columns), got shape {X.shape}: "
                "Reshape your data: a single feature vector is X.reshape(1, -1)"
            )
        if fitting:
            if X.shape[1] == 0:
                raise CostModelInputError(
                    f"0 feature(s) (shape={X.shape}) while a minimum of 1 is required."
                )
            expected = None if self.form == "free" else len(FEATURE_NAMES)
        else:
            expected = getattr(self, "n_features_in_", len(FEATURE_NAMES))
        if expected is not None and X.shape[1] != expected:
            raise CostModelInputError(
                f"X has {X.shape[1]} features, but CorrectionMLP is expecting {expected} "
                f"features as input: the columns of learned_cost.features.FEATURE_NAMES "
                f"(form={self.form!r}), got shape {X.shape}"
            )
        if not np.isfinite(X).all():
            raise CostModelInputError("features contain NaN or inf: every feature must be finite")
        return X

    @staticmethod
    def _check_y(y: Any) -> np.ndarray:
        """Targets as a finite float64 vector; a column vector (n, 1) is taken as one."""
        if y is None:
            raise CostModelInputError(
                "CorrectionMLP requires y to be passed, but the target y is None"
            )
        y = np.asarray(y)
        if np.iscomplexobj(y):
            raise CostModelInputError("Complex data not supported: targets are real numbers")
        y = y.astype(np.float64)
        if y.ndim == 2 and y.shape[1] == 1:
            y = y[:, 0]
        if y.ndim != 1:
            raise CostModelInputError(f"y should be a 1d array of log-ratios, got shape {y.shape}")
        if not np.isfinite(y).all():
            raise CostModelInputError("targets contain NaN or inf; drop rows without a measurement")
        return y

    def _scale(self, X: np.ndarray) -> np.ndarray:
        return (X - self.scaler_mean_) / self.scaler_scale_

    @staticmethod
    def _parts(X: np.ndarray) -> np.ndarray:
        return X[:, [FEATURE_NAMES.index(p) for p in PART_FEATURES]]

    # ---- state for persistence (learned_cost.persist) ---------------------------------------
    def state_arrays(self) -> dict[str, np.ndarray]:
        """Everything fitted, as named float arrays: no pickle anywhere."""
        self._require_fit()
        arrays = {
            f"{_member_prefix(j)}{k}": v.detach().double().numpy()
            for j, net in enumerate(self.nets_)
            for k, v in net.state_dict().items()
        }
        arrays["scaler_mean"] = self.scaler_mean_
        arrays["scaler_scale"] = self.scaler_scale_
        arrays["y_range"] = np.array([self.y_min_, self.y_max_])
        if getattr(self, "twins_", None) is not None:
            arrays.update(self.twins_.arrays())
        return arrays

    @classmethod
    def from_state(cls, params: dict[str, Any], arrays: dict[str, np.ndarray]) -> CorrectionMLP:
        """Rebuild a fitted model from `get_params()` and `state_arrays()`."""
        params = dict(params)
        params["hidden"] = tuple(params.get("hidden", ()))
        params.setdefault("n_members", 1)  # saved before ensembles: one network
        model = cls(**params)
        if model.form not in FORMS:
            raise CostModelError(f"saved model has unknown form {model.form!r}")
        n_in = int(arrays["scaler_mean"].shape[0])
        model.nets_ = []
        for j, form in enumerate(model.net_forms()):
            net = _network(n_in, model.hidden, _n_out(form), model.dropout)
            prefix = _member_prefix(j)
            state = {
                k[len(prefix) :]: torch.as_tensor(v, dtype=torch.float32)
                for k, v in arrays.items()
                if k.startswith(prefix)
            }
            try:
                net.load_state_dict(state)
            except RuntimeError as e:
                raise CostModelError(
                    f"saved weights do not fit the saved hyper-parameters: {e}"
                ) from e
            net.eval()
            model.nets_.append(net)
        model._weights = None
        model._numpy_weights()
        model.scaler_mean_ = np.asarray(arrays["scaler_mean"], dtype=np.float64)
        model.scaler_scale_ = np.asarray(arrays["scaler_scale"], dtype=np.float64)
        model.y_min_, model.y_max_ = (float(v) for v in arrays["y_range"])
        model.feature_names_ = FEATURE_NAMES if n_in == len(FEATURE_NAMES) else None
        model.n_features_in_ = n_in
        if model.twins:
            if "twins.keys" not in arrays:
                raise CostModelError("saved model has twins=True but no twin table")
            model.twins_ = TwinTable.from_arrays(arrays)
        return model
