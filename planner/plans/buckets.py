"""Shape buckets: which plan serves which shapes (docs/formulas.md §15, docs/runtime.md).

A fusion plan tuned at one shape stays good over a range of nearby shapes, and every
realization costs a compile. So dynamic dimensions (a sequence length, a batch size) are
cut into buckets; one plan is tuned per bucket at its representative shape, and the
runtime realizes it once per bucket. Three policies per dimension:

- `Pow2`: buckets (2^(k-1), 2^k], the default: few buckets, each within 2x of its
  representative, so a plan never runs more than 2x off the shape it was tuned at;
- `Edges`: explicit upper edges (a deployment that knows its shapes);
- learned from an observed shape histogram (`learn_edges`: 1-D k-means on log-sizes or
  weighted quantiles), so buckets are narrow where traffic is dense: the answer to
  "collect runtime shapes, adapt the fusion decision, bound the recompiles".

A `BucketSpec` names the dynamic dims (input index, axis) and gives each a policy; its
`bucket_of(shapes)` returns the `Bucket` holding concrete input shapes, or None when a
size falls outside every bucket (the runtime then takes the default plan: never an error).
The spec is stored in the plan cache beside the plans, so the runtime buckets shapes the
way the tuning job did. Pure Python: the runtime path needs nothing but the stdlib here.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from itertools import pairwise
from typing import Any, Protocol

from planner.errors import FusionPlannerError

Shapes = tuple[tuple[int, ...], ...]


class BucketError(FusionPlannerError):
    """A bucket policy or spec that cannot be built or parsed."""


# ---- per-dimension policies ------------------------------------------------------------
class Policy(Protocol):
    """Cuts one dimension's sizes into inclusive ranges [lo, hi].

    `range_of(size)` returns the range holding `size`, or None when no bucket holds it.
    It runs on every runtime call that misses the per-shape memo, so it must be cheap
    and pure. `ranges()` lists every bucket in order (finite policies only).
    """

    kind: str

    def range_of(self, size: int) -> tuple[int, int] | None: ...

    def ranges(self) -> tuple[tuple[int, int], ...]: ...

    def to_json(self) -> dict[str, Any]: ...


@dataclass(frozen=True)
class Pow2:
    """Buckets (2^(k-1), 2^k] clipped to [lo, hi]; the representative is the upper edge."""

    lo: int = 1
    hi: int = 1 << 31
    kind: str = field(default="pow2", init=False)

    def __post_init__(self) -> None:
        if not 1 <= self.lo <= self.hi:
            raise BucketError(f"pow2 bounds must satisfy 1 <= lo <= hi, got {self.lo}..{self.hi}")

    def range_of(self, size: int) -> tuple[int, int] | None:
        if size < self.lo or size > self.hi:
            return None
        top = 1 << (size - 1).bit_length() if size > 1 else 1
        return max(top // 2 + 1, self.lo), min(top, self.hi)

    def ranges(self) -> tuple[tuple[int, int], ...]:
        if self.hi >= 1 << 31:
            raise BucketError("pow2 without an upper bound has no finite list of buckets")
        out: list[tuple[int, int]] = []
        size = self.lo
        while size <= self.hi:
            r = self.range_of(size)
            assert r is not None
            out.append(r)
            size = r[1] + 1
        return tuple(out)

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "lo": self.lo, "hi": self.hi}


@dataclass(frozen=True)
class Edges:
    """Explicit inclusive upper edges: [lo..e0], [e0+1..e1], ...; past the last: none.

    `source` says where the edges came from ("explicit", "kmeans k=4 over 812 shapes").
    """

    edges: tuple[int, ...]
    lo: int = 1
    source: str = "explicit"
    kind: str = field(default="edges", init=False)

    def __post_init__(self) -> None:
        e = self.edges
        if not e or any(b <= a for a, b in pairwise(e)) or e[0] < self.lo or self.lo < 1:
            raise BucketError(
                f"edges must be strictly increasing sizes >= lo={self.lo}, got {list(e)}"
            )

    def range_of(self, size: int) -> tuple[int, int] | None:
        if size < self.lo or size > self.edges[-1]:
            return None
        prev = self.lo - 1
        for e in self.edges:  # a handful of edges: a scan beats bisect's call overhead
            if size <= e:
                return prev + 1, e
            prev = e
        return None  # unreachable: size <= edges[-1]

    def ranges(self) -> tuple[tuple[int, int], ...]:
        starts = (self.lo, *(e + 1 for e in self.edges[:-1]))
        return tuple(zip(starts, self.edges))

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "edges": list(self.edges), "lo": self.lo, "source": self.source}


def policy_from_json(data: Mapping[str, Any]) -> Policy:
    kind = data.get("kind")
    try:
        if kind == "pow2":
            return Pow2(int(data["lo"]), int(data["hi"]))
        if kind == "edges":
            return Edges(
                tuple(int(e) for e in data["edges"]),
                int(data.get("lo", 1)),
                str(data.get("source", "explicit")),
            )
    except (KeyError, TypeError, ValueError) as e:
        raise BucketError(f"bucket policy record {dict(data)} is malformed: {e}") from e
    raise BucketError(f"unknown bucket policy kind {kind!r}; expected pow2 or edges")


def parse_policy(
    text: str, lo: int = 1, hi: int = 1 << 31, histogram: Mapping[int, int] | None = None
) -> Policy:
    """A policy from CLI text: "pow2", "edges:128,512,2048", "kmeans:4" or "quantile:4".

    The learned forms need `histogram` (size -> count), e.g. from the tuning queue.
    """
    name, _, arg = text.partition(":")
    if name == "pow2":
        return Pow2(lo, hi)
    if name == "edges":
        try:
            edges = tuple(int(x) for x in arg.split(",") if x.strip())
        except ValueError:
            raise BucketError(f"bad edges {arg!r}: expected e.g. edges:128,512,2048") from None
        return Edges(edges, min(lo, edges[0]) if edges else lo)
    if name in ("kmeans", "quantile"):
        if not histogram:
            raise BucketError(
                f"{name} buckets are learned from observed shapes, and none were given: "
                "run the model with the runtime backend first (misses fill the tuning "
                "queue), or use pow2 / edges:..."
            )
        try:
            k = int(arg or 4)
        except ValueError:
            raise BucketError(f"bad bucket count {arg!r} in {text!r}") from None
        return learn_edges(histogram, k, method=name)
    raise BucketError(
        f"unknown bucket policy {text!r}; use pow2, edges:a,b,c, kmeans:k, quantile:k"
    )


# ---- learning edges from a histogram ---------------------------------------------------
def learn_edges(histogram: Mapping[int, int], k: int, *, method: str = "kmeans") -> Edges:
    """Edges for at most `k` buckets fitted to observed sizes (size -> count).

    kmeans: weighted 1-D k-means on log2(size) (a ratio of shapes, not a difference,
    decides how far a plan is off), initialised at weighted quantiles, so it is
    deterministic. quantile: equal-traffic buckets. Either way each edge is an observed
    size, the last edge is the largest observed size, and sizes above it fall outside
    (they reach the default plan and the tuning queue, and the next fit covers them).
    """
    items = sorted((int(s), int(c)) for s, c in histogram.items() if c > 0 and s > 0)
    if not items:
        raise BucketError("cannot learn buckets from an empty histogram")
    if k < 1:
        raise BucketError(f"bucket count must be >= 1, got {k}")
    k = min(k, len(items))
    if method == "quantile":
        labels = _quantile_labels(items, k)
    elif method == "kmeans":
        labels = _kmeans_labels(items, k)
    else:
        raise BucketError(f"unknown learning method {method!r}; use kmeans or quantile")
    edges = sorted(
        {
            items[i][0]
            for i in range(len(items))
            if i + 1 == len(items) or labels[i + 1] != labels[i]
        }
    )
    total = sum(c for _, c in items)
    return Edges(tuple(edges), 1, f"{method} k={k} over {total} shapes")


def _quantile_labels(items: Sequence[tuple[int, int]], k: int) -> list[int]:
    total = sum(c for _, c in items)
    labels, seen = [], 0
    for _, c in items:
        labels.append(min(k - 1, int(seen * k / total)))
        seen += c
    return labels


def _kmeans_labels(items: Sequence[tuple[int, int]], k: int, iters: int = 100) -> list[int]:
    xs = [math.log2(s) for s, _ in items]
    ws = [c for _, c in items]
    start = _quantile_labels(items, k)
    centers = _centers(xs, ws, start, k)
    labels = start
    for _ in range(iters):
        new = [min(range(len(centers)), key=lambda j: abs(x - centers[j])) for x in xs]
        if new == labels:
            break
        labels = new
        centers = _centers(xs, ws, labels, len(centers))
    return labels  # sorted xs and 1-D nearest-center labels are monotone: contiguous runs


def _centers(xs: list[float], ws: list[int], labels: list[int], k: int) -> list[float]:
    sums = [0.0] * k
    mass = [0] * k
    for x, w, lab in zip(xs, ws, labels):
        sums[lab] += x * w
        mass[lab] += w
    return [sums[j] / mass[j] for j in range(k) if mass[j]]


# ---- buckets over whole input signatures -------------------------------------------------
@dataclass(frozen=True)
class DynamicDim:
    """A dimension that varies at run time: `shapes[input][axis]`, called `name`."""

    name: str
    input: int
    axis: int


@dataclass(frozen=True, slots=True)
class Bucket:
    """A set of input signatures: each dim is an exact size or an inclusive (lo, hi).

    `key` is the stable text the plan cache stores, e.g. "[8,257-512,768]". Slotted and
    keyed at construction: a lookup of a new shape makes one, and fewer allocations mean
    fewer garbage-collector pauses landing in lookups.
    """

    dims: tuple[tuple[int | tuple[int, int], ...], ...]
    key: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        if not self.key:
            parts = []
            for shape in self.dims:
                dims = [str(d) if d.__class__ is int else f"{d[0]}-{d[1]}" for d in shape]
                parts.append("[" + ",".join(dims) + "]")
            object.__setattr__(self, "key", ";".join(parts))

    def representative(self) -> Shapes:
        """The shapes a plan for this bucket is tuned at: every range's upper edge."""
        return tuple(tuple(d if isinstance(d, int) else d[1] for d in s) for s in self.dims)

    def contains(self, shapes: Sequence[Sequence[int]]) -> bool:
        if len(shapes) != len(self.dims):
            return False
        for shape, dims in zip(shapes, self.dims):
            if len(shape) != len(dims):
                return False
            for size, d in zip(shape, dims):
                if (size != d) if isinstance(d, int) else not d[0] <= size <= d[1]:
                    return False
        return True

    def renumbered(self, order: Sequence[int | None], n_inputs: int) -> Bucket:
        """This bucket over `n_inputs` inputs renumbered: input i becomes input `order[i]`
        (None: the input is gone). See `BucketSpec.renumbered`."""
        dims: list[tuple[int | tuple[int, int], ...]] = [()] * n_inputs
        for i, shape in enumerate(self.dims):
            if i < len(order) and order[i] is not None:
                dims[order[i]] = shape
        return Bucket(tuple(dims))

    def ranges(self) -> dict[int, dict[int, tuple[int, int]]]:
        """{input: {axis: (lo, hi)}}: the form `capture_dynamic.export_dynamic` takes."""
        out: dict[int, dict[int, tuple[int, int]]] = {}
        for i, shape in enumerate(self.dims):
            for a, d in enumerate(shape):
                if not isinstance(d, int):
                    out.setdefault(i, {})[a] = d
        return out


def exact_key(shapes: Sequence[Sequence[int]]) -> str:
    """The cache key of one exact input signature, e.g. "[8,300,768]"."""
    return ";".join("[" + ",".join(map(str, map(int, s))) + "]" for s in shapes)


@dataclass(frozen=True)
class BucketSpec:
    """Dynamic dims and a policy for each; every other dim must match exactly."""

    dims: tuple[DynamicDim, ...]
    policies: tuple[Policy, ...]

    def __post_init__(self) -> None:
        if len(self.dims) != len(self.policies):
            raise BucketError("a BucketSpec needs one policy per dynamic dim")
        if len(self._by_pos) != len(self.dims):
            raise BucketError("a dynamic dim is listed twice in the bucket spec")

    @cached_property
    def _by_pos(self) -> dict[tuple[int, int], Policy]:
        """(input, axis) -> policy: read on every bucket_of call."""
        return {(d.input, d.axis): p for d, p in zip(self.dims, self.policies)}

    @classmethod
    def uniform(cls, dims: Iterable[DynamicDim], policy: Policy | None = None) -> BucketSpec:
        dims = tuple(dims)
        return cls(dims, tuple(policy or Pow2() for _ in dims))

    def bucket_of(self, shapes: Sequence[Sequence[int]]) -> Bucket | None:
        """The bucket holding `shapes`, or None when a dynamic size is in no bucket."""
        out: list[list[Any]] = [list(s) for s in shapes]
        for d, pol in zip(self.dims, self.policies):
            if d.input >= len(out) or d.axis >= len(out[d.input]):
                return None  # the spec names a dim these inputs do not have
            r = pol.range_of(int(out[d.input][d.axis]))
            if r is None:
                return None
            out[d.input][d.axis] = r
        return Bucket(tuple(map(tuple, out)))

    def buckets(self, base_shapes: Sequence[Sequence[int]]) -> tuple[Bucket, ...]:
        """Every bucket over `base_shapes` (whose non-dynamic dims are kept): what a tuning
        job enumerates. Needs finite policies (Pow2 with `hi`, Edges)."""
        # dims sharing a name are one size (e.g. input ids and their mask): they move together
        by_name: dict[str, list[tuple[int, int]]] = {}
        ranges: dict[str, tuple[tuple[int, int], ...]] = {}
        for d, p in zip(self.dims, self.policies):
            if d.input >= len(base_shapes) or d.axis >= len(base_shapes[d.input]):
                raise BucketError(
                    f"dynamic dim {d.name} is input {d.input} axis {d.axis}, but the inputs "
                    f"have shapes {[list(s) for s in base_shapes]}"
                )
            by_name.setdefault(d.name, []).append((d.input, d.axis))
            ranges.setdefault(d.name, p.ranges())
        choices = [[(by_name[n], r) for r in rs] for n, rs in ranges.items()]
        out: list[Bucket] = []
        for combo in _product(choices):
            dims = [list(s) for s in base_shapes]
            for positions, r in combo:
                for i, a in positions:
                    dims[i][a] = r  # type: ignore[call-overload]
            out.append(Bucket(tuple(tuple(s) for s in dims)))
        return tuple(out)

    def renumbered(self, order: Sequence[int | None]) -> BucketSpec:
        """This spec with input i renumbered `order[i]` (None: the input is gone, and its
        dynamic dims with it). The runtime numbers a model's inputs in the order its graph
        first uses them (dynamo's), which need not be the order they were passed in (a
        `transformers` BART called with `input_ids, attention_mask, decoder_input_ids`
        reads `decoder_input_ids` first): a spec written over the call's order is
        renumbered before it is stored for the runtime."""
        kept = [
            (DynamicDim(d.name, order[d.input], d.axis), p)
            for d, p in zip(self.dims, self.policies)
            if d.input < len(order) and order[d.input] is not None
        ]
        return BucketSpec(tuple(d for d, _ in kept), tuple(p for _, p in kept))

    def representative_params(self, bucket: Bucket) -> dict[str, int]:
        """{dim name: size} of `bucket`'s representative, e.g. {"S": 512}: the shape
        parameters a tuning job builds the model with (`ModelSpec.with_params(**...)`)."""
        rep = bucket.representative()
        return {d.name: rep[d.input][d.axis] for d in self.dims}

    def describe(self) -> str:
        """The spec for people, one entry per dim name: `S 128..1024 in powers of two`,
        `B 1..64 at edges 8,32,64`."""
        seen: dict[str, str] = {}
        for d, p in zip(self.dims, self.policies):
            rs = p.ranges() if not (isinstance(p, Pow2) and p.hi == 1 << 31) else ()
            span = f"{rs[0][0]}..{rs[-1][1]}" if rs else "1.."
            how = (
                "in powers of two"
                if isinstance(p, Pow2)
                else f"at edges {','.join(map(str, p.edges))}"
                if isinstance(p, Edges)
                else p.kind
            )
            seen.setdefault(d.name, f"{d.name} {span} {how}")
        return "; ".join(seen.values())

    def label(self, bucket: Bucket) -> str:
        """A bucket for people: `S 257..512` (`B 2, S 33..64` with two dims); the cache
        keys it as `[8,257-512,768]`."""
        seen: dict[str, str] = {}
        for d in self.dims:
            if d.input < len(bucket.dims) and d.axis < len(bucket.dims[d.input]):
                v = bucket.dims[d.input][d.axis]
                if isinstance(v, int) or v[0] == v[1]:
                    text = str(v if isinstance(v, int) else v[0])
                else:
                    text = f"{v[0]}..{v[1]}"
                seen.setdefault(d.name, f"{d.name} {text}")
        return ", ".join(seen.values()) or bucket.key

    def to_json(self) -> dict[str, Any]:
        return {
            "dims": [[d.name, d.input, d.axis] for d in self.dims],
            "policies": [p.to_json() for p in self.policies],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> BucketSpec:
        try:
            dims = tuple(DynamicDim(str(n), int(i), int(a)) for n, i, a in data["dims"])
            return cls(dims, tuple(policy_from_json(p) for p in data["policies"]))
        except (KeyError, TypeError, ValueError) as e:
            raise BucketError(f"bucket spec record is malformed: {e}") from e


def _product(choices: list[list[Any]]) -> Iterable[tuple[Any, ...]]:
    if not choices:
        yield ()
        return
    for head in choices[0]:
        for rest in _product(choices[1:]):
            yield (head, *rest)


def parse_dynamic(
    text: str,
    dims: Mapping[str, Any],
    policy: str = "pow2",
    histogram: Mapping[str, Mapping[int, int]] | None = None,
) -> BucketSpec:
    """A spec from CLI text "S=128..4096[,B=1..32]" and a model's dim map (`ModelSpec.dims`:
    name -> (input, axis), or a tuple of such pairs when several inputs follow one name).

    `policy` is parse_policy's text, applied to every listed dim; learned policies take
    their histogram per dim name from `histogram`.
    """
    out_dims: list[DynamicDim] = []
    pols: list[Policy] = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, eq, rng = part.partition("=")
        lo_text, dots, hi_text = rng.partition("..")
        if not eq or not dots:
            raise BucketError(f"bad dynamic dim {part!r}: expected NAME=LO..HI, e.g. S=128..4096")
        if name not in dims:
            raise BucketError(
                f"dynamic dim {name!r} is not a dimension of this model; it has "
                f"{', '.join(sorted(dims)) or 'none'}"
            )
        try:
            lo, hi = int(lo_text), int(hi_text)
        except ValueError:
            raise BucketError(f"bad range in {part!r}: LO and HI must be integers") from None
        if not 1 <= lo <= hi:
            raise BucketError(f"bad range in {part!r}: need 1 <= LO <= HI")
        pol = parse_policy(policy, lo, hi, (histogram or {}).get(name))
        if isinstance(pol, Edges):  # never a bucket (nor a tuning shape) outside LO..HI
            pol = _clip_edges(pol, lo, hi) if pol.source != "explicit" else _cut_edges(pol, lo, hi)
        for i, a in _positions(dims[name]):
            out_dims.append(DynamicDim(name, i, a))
            pols.append(pol)
    if not out_dims:
        raise BucketError("no dynamic dims given: expected e.g. S=128..4096")
    return BucketSpec(tuple(out_dims), tuple(pols))


def _positions(value: Any) -> tuple[tuple[int, int], ...]:
    """(input, axis) -> ((input, axis),); a tuple of pairs stays as it is."""
    if len(value) == 2 and all(isinstance(v, int) for v in value):
        return ((int(value[0]), int(value[1])),)
    return tuple((int(i), int(a)) for i, a in value)


def _cut_edges(p: Edges, lo: int, hi: int) -> Edges:
    """Explicit edges cut to the declared range [lo, hi]: edges inside it are kept, and
    the last bucket ends at `hi` (its representative, the size tuned at, is then inside)."""
    return Edges((*(e for e in p.edges if lo <= e < hi), hi), lo, p.source)


def _clip_edges(p: Edges, lo: int, hi: int) -> Edges:
    """Learned edges restricted to the declared range [lo, hi]; the last bucket reaches
    `hi`, as a bucket of its own when it would otherwise span more than 2x."""
    kept = [e for e in p.edges if lo <= e < hi]
    edges = [*kept, hi] if not kept or hi > 2 * kept[-1] else [*kept[:-1], hi]
    return Edges(tuple(edges), lo, p.source)
