"""The fusion pattern language (docs/formulas.md §6) and its matcher over OpGraph.

    Pattern ::= Op | Pattern -> Pattern | Pattern || Pattern | Pattern* | Pattern | Pattern
               Op      Seq                Par                Rep        Alt

A pattern matches a set of nodes entered at one node and left at one or more exit nodes.
`Seq` continues at a consumer of the previous part's exits; views in between are
absorbed into the match (they are free). `Par` matches its branches at distinct consumers
of one tensor with no path between them (docs/formulas.md §3: shared input, no dependency).
`Rep(p, lo, hi)` repeats p along a chain (lo=0 makes it optional). `Where` filters
matches by a predicate on the whole match. `Found` takes its matches from a hand-written
recognizer (planner.fusion.recognize), for patterns whose conditions go beyond structure. The library of named patterns and the
conflict resolution live in planner/fusion/patterns.py.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from planner.fusion.opkinds import Kind, kinds
from planner.ir.graph import Category, OpGraph


@dataclass(frozen=True)
class Path:
    """A partial match: its nodes, its exit nodes, and named roles (role, node)."""

    nodes: frozenset[int]
    exits: tuple[int, ...]
    roles: tuple[tuple[str, int], ...] = ()


class Ctx:
    """Per-graph facts the matcher needs, computed once."""

    def __init__(self, graph: OpGraph):
        self.graph = graph
        self.kinds = kinds(graph)
        self.memo: dict[tuple[int, int], list[Path]] = {}
        self._next: dict[int, list[tuple[int, frozenset[int]]]] = {}

    def next_nodes(self, exits: Iterable[int]) -> list[tuple[int, frozenset[int]]]:
        """Consumers of `exits`' outputs, each with the view nodes passed on the way."""
        out: dict[int, frozenset[int]] = {}
        for e in exits:
            if e not in self._next:
                self._next[e] = self._walk_views(e)
            for c, views in self._next[e]:
                out.setdefault(c, views)
        return list(out.items())

    def _walk_views(self, start: int) -> list[tuple[int, frozenset[int]]]:
        found: list[tuple[int, frozenset[int]]] = []
        stack = [(s, frozenset[int]()) for s in self.graph.succ[start]]
        while stack:
            n, via = stack.pop()
            if self.kinds[n] is Kind.FREE:
                stack.extend((s, via | {n}) for s in self.graph.succ[n])
            else:
                found.append((n, via))
        return found


class Pattern:
    """Base of the pattern language. `paths(ctx, start)`: every match entered at `start`."""

    nullable = False  # whether the pattern may match no node at all (Rep with lo=0)

    def paths(self, ctx: Ctx, start: int) -> list[Path]:
        raise NotImplementedError


@dataclass(frozen=True, eq=False)
class Op(Pattern):
    """One node. Each field given must hold (kind in kinds, category in categories, op in
    ops, where(graph, node)); an Op with no field matches any node that is not a view."""

    kinds: tuple[Kind, ...] = ()
    categories: tuple[Category, ...] = ()
    ops: tuple[str, ...] = ()
    role: str = ""
    where: Callable[[OpGraph, int], bool] | None = None

    def paths(self, ctx: Ctx, start: int) -> list[Path]:
        n = ctx.graph.nodes[start]
        if (
            (self.kinds and ctx.kinds[start] not in self.kinds)
            or (self.categories and n.category not in self.categories)
            or (self.ops and n.op not in self.ops)
            or (self.where is not None and not self.where(ctx.graph, start))
        ):
            return []
        roles = ((self.role, start),) if self.role else ()
        return [Path(frozenset((start,)), (start,), roles)]


class Seq(Pattern):
    """p1 -> p2 -> ...: each part starts at a consumer of the previous part's exits."""

    def __init__(self, *parts: Pattern):
        self.parts = parts
        self.nullable = all(p.nullable for p in parts)

    def paths(self, ctx: Ctx, start: int) -> list[Path]:
        out: list[Path] = []
        for i, part in enumerate(self.parts):  # leading optional parts may be skipped
            found = part.paths(ctx, start)
            if found:
                out.extend(self._extend(ctx, found, i + 1))
            if not part.nullable:
                break
        return out

    def _extend(self, ctx: Ctx, current: list[Path], k: int) -> list[Path]:
        for part in self.parts[k:]:
            grown: list[Path] = list(current) if part.nullable else []
            for p in current:
                for c, views in ctx.next_nodes(p.exits):
                    if c in p.nodes:
                        continue
                    for q in part.paths(ctx, c):
                        if not q.nodes & p.nodes:
                            grown.append(
                                Path(p.nodes | views | q.nodes, q.exits, p.roles + q.roles)
                            )
            current = grown
            if not current:
                return []
        return current


class Rep(Pattern):
    """p repeated along a chain, lo..hi times (p+ is Rep(p, 1); p* is Rep(p, 0)).

    For each (start, exit) only the largest match is kept, so a long elementwise region
    yields one match per end node rather than one per path through it.
    """

    def __init__(self, part: Pattern, lo: int = 1, hi: int = 64):
        self.part, self.lo, self.hi = part, lo, hi
        self.nullable = lo == 0

    def paths(self, ctx: Ctx, start: int) -> list[Path]:
        key = (id(self), start)
        if key in ctx.memo:
            return ctx.memo[key]
        best: dict[tuple[int, ...], tuple[int, Path]] = {}
        frontier = [(p, 1) for p in self.part.paths(ctx, start)]
        while frontier:
            p, count = frontier.pop()
            if count >= max(self.lo, 1):
                old = best.get(p.exits)
                if old is None or len(old[1].nodes) < len(p.nodes):
                    best[p.exits] = (count, p)
            if count >= self.hi:
                continue
            for c, views in ctx.next_nodes(p.exits):
                if c in p.nodes:
                    continue
                for q in self.part.paths(ctx, c):
                    if not q.nodes & p.nodes:
                        nxt = Path(p.nodes | views | q.nodes, q.exits, p.roles + q.roles)
                        old = best.get(nxt.exits)
                        if old is None or len(old[1].nodes) < len(nxt.nodes):
                            frontier.append((nxt, count + 1))
        out = [p for _, p in best.values()]
        ctx.memo[key] = out
        return out


class Alt(Pattern):
    """p1 | p2 | ...: the matches of every alternative."""

    def __init__(self, *alts: Pattern):
        self.alts = alts
        self.nullable = any(a.nullable for a in alts)

    def paths(self, ctx: Ctx, start: int) -> list[Path]:
        return [p for a in self.alts for p in a.paths(ctx, start)]


class Par(Pattern):
    """p1 || p2 || ...: branches at distinct consumers of one tensor, no path between them.

    `Par.many(p, lo)` is the repetition form: every sibling consumer that matches p, at
    least lo of them. A Par match is entered at its lowest-index branch (so each set of
    siblings is found once) and exits at every branch's exit.
    """

    def __init__(self, *branches: Pattern, many: Pattern | None = None, lo: int = 2):
        self.branches, self.many_of, self.lo = branches, many, lo

    @classmethod
    def many(cls, branch: Pattern, lo: int = 2) -> Par:
        return cls(many=branch, lo=lo)

    def paths(self, ctx: Ctx, start: int) -> list[Path]:
        g = ctx.graph
        out: list[Path] = []
        for tid in g.nodes[start].inputs:
            root = g.root(tid)
            sibs = sorted(_readers_of_root(g, root) - {start})
            sibs = [s for s in sibs if s > start and not _linked(g, s, start)]
            if self.many_of is not None:
                out.extend(self._many(ctx, start, sibs))
            else:
                out.extend(self._fixed(ctx, start, sibs))
        return out

    def _many(self, ctx: Ctx, start: int, sibs: list[int]) -> list[Path]:
        assert self.many_of is not None
        chosen = [p for p in self.many_of.paths(ctx, start)[:1]]
        if not chosen:
            return []
        for s in sibs:
            ps = self.many_of.paths(ctx, s)
            if ps and all(not _linked_sets(ctx.graph, ps[0].nodes, c.nodes) for c in chosen):
                chosen.append(ps[0])
        if len(chosen) < self.lo:
            return []
        return [_join(chosen)]

    def _fixed(self, ctx: Ctx, start: int, sibs: list[int]) -> list[Path]:
        results: list[Path] = []

        def assign(todo: list[Pattern], chosen: list[Path], free: list[int]) -> None:
            if not todo:
                results.append(_join(chosen))
                return
            for s in free:
                for p in todo[0].paths(ctx, s):
                    if all(not _linked_sets(ctx.graph, p.nodes, c.nodes) for c in chosen):
                        assign(todo[1:], [*chosen, p], [f for f in free if f != s])

        for k, branch in enumerate(self.branches):  # any branch may be the lowest entry
            rest = [b for j, b in enumerate(self.branches) if j != k]
            for p in branch.paths(ctx, start):
                assign(rest, [p], sibs)
        return results


class Where(Pattern):
    """p, kept only where `pred(graph, path)` holds."""

    def __init__(self, part: Pattern, pred: Callable[[OpGraph, Path], bool]):
        self.part, self.pred = part, pred
        self.nullable = part.nullable

    def paths(self, ctx: Ctx, start: int) -> list[Path]:
        return [p for p in self.part.paths(ctx, start) if self.pred(ctx.graph, p)]


class Found(Pattern):
    """The matches a recognizer finds in the whole graph (`find(graph)` -> Paths), each
    entered at its lowest-index node. Lets the library match exactly what a hand-written
    recognizer accepts (planner.fusion.recognize: attention's scale and mask, the weights of
    sibling GEMMs), so nothing else has to describe the same pattern again."""

    def __init__(self, find: Callable[[OpGraph], Iterable[Path]]):
        self.find = find

    def paths(self, ctx: Ctx, start: int) -> list[Path]:
        key = (id(self), -1)
        if key not in ctx.memo:
            ctx.memo[key] = list(self.find(ctx.graph))
        return [p for p in ctx.memo[key] if min(p.nodes) == start]


def _join(paths: list[Path]) -> Path:
    nodes = frozenset().union(*(p.nodes for p in paths))
    exits = tuple(e for p in paths for e in p.exits)
    return Path(nodes, exits, tuple(r for p in paths for r in p.roles))


def _readers_of_root(g: OpGraph, root: int) -> set[int]:
    """Non-view nodes that read tensor `root` directly or through a chain of views."""
    out: set[int] = set()
    stack = list(g.consumers[root])
    while stack:
        n = stack.pop()
        if g.nodes[n].category is Category.VIEW:
            stack.extend(c for t in g.nodes[n].outputs for c in g.consumers[t])
        else:
            out.add(n)
    return out


def _linked(g: OpGraph, a: int, b: int) -> bool:
    return bool(g.reach[a] >> b & 1 or g.reach[b] >> a & 1)


def _linked_sets(g: OpGraph, a: frozenset[int], b: frozenset[int]) -> bool:
    return any(_linked(g, x, y) for x in a for y in b)
