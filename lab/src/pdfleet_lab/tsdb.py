"""An in-memory Prometheus for the benchmark: scraped samples, and the PromQL the operator asks.

Where it fits: the fleet simulator scrapes its engines' metric families into a `SimPrometheus`
at the scrape interval the shipped scrape configuration uses; the benchmark then reads a
service's window with the operator's own `pdfleet.autoscale.metrics.PrometheusSource`, whose
client is this object instead of prometheus-api-client. Only the transport differs: the
queries are `pdfleet.autoscale.promql`'s strings, and they are evaluated with Prometheus'
semantics (left-open range windows, `rate()` extrapolated to the window's edges,
`histogram_quantile()` interpolating inside a bucket, subqueries aligned to absolute time),
which tests/integration/prometheus holds to the real Prometheus through `promtool test rules`.

Only the subset `promql.py` builds is understood: selectors with `=` matchers, `rate`,
`deriv`, `avg_over_time`, `max_over_time`, `histogram_quantile`, `sum`/`avg` (optionally
`by`), a subquery, `+ - * /` between vectors and number literals. Anything else is a
`PromQLError`.
"""

from __future__ import annotations

import bisect
import math
import re
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

Labels = tuple[tuple[str, str], ...]
"""A series' labels, sorted by name, without the metric name."""

Sample = tuple[float, float]
InstantVector = list[tuple[Labels, float]]
RangeVector = list[tuple[Labels, list[Sample]]]
Value = InstantVector | RangeVector | float


class PromQLError(ValueError):
    """A query outside the supported subset, or malformed."""


# --------------------------------------------------------------------------------------------
# Storage


@dataclass
class Series:
    times: list[float] = field(default_factory=list)
    values: list[float] = field(default_factory=list)

    def between(self, start: float, end: float) -> list[Sample]:
        """Samples with start < t <= end (Prometheus 3 ranges are left-open)."""
        lo = bisect.bisect_right(self.times, start)
        hi = bisect.bisect_right(self.times, end)
        return list(zip(self.times[lo:hi], self.values[lo:hi], strict=True))


def labels_of(labels: Mapping[str, str]) -> Labels:
    return tuple(sorted(labels.items()))


class SimPrometheus:
    """Samples by metric name and labels, and an evaluator over them at `now`.

    `custom_query` answers like prometheus-api-client's: the `result` list of an instant
    query, each item `{"metric": {...}, "value": [time, "value"]}`."""

    def __init__(self, retention_s: float = 900.0) -> None:
        self.now = 0.0
        self._retention_s = retention_s
        self._series: dict[str, dict[Labels, Series]] = defaultdict(dict)

    def add(self, name: str, labels: Mapping[str, str], t: float, value: float) -> None:
        """One scraped sample; samples of a series come in time order."""
        series = self._series[name].setdefault(labels_of(labels), Series())
        series.times.append(t)
        series.values.append(value)

    def forget_before(self, t: float) -> None:
        """Drop samples older than the retention before `t` (no query looks that far)."""
        horizon = t - self._retention_s
        for by_labels in self._series.values():
            for series in by_labels.values():
                cut = bisect.bisect_right(series.times, horizon)
                if cut:
                    del series.times[:cut], series.values[:cut]

    def series(self) -> Iterator[tuple[str, Labels, Series]]:
        """Every series held: (metric name, labels, samples)."""
        for name, by_labels in self._series.items():
            for labels, series in by_labels.items():
                yield name, labels, series

    def select(self, name: str, matchers: Mapping[str, str]) -> Iterator[tuple[Labels, Series]]:
        for labels, series in self._series.get(name, {}).items():
            have = dict(labels)
            if all(have.get(k, "") == v for k, v in matchers.items()):
                yield labels, series

    def custom_query(self, query: str) -> list[dict[str, Any]]:
        vector = _Evaluator(self, self.now).instant(parse(query))
        return [{"metric": dict(labels), "value": [self.now, _format(v)]} for labels, v in vector]


def _format(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


# --------------------------------------------------------------------------------------------
# Parsing


@dataclass(frozen=True)
class Selector:
    name: str
    matchers: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Ranged:
    """`selector[range]`."""

    selector: Selector
    range_s: float


@dataclass(frozen=True)
class Subquery:
    """`expr[range:step]`."""

    expr: Node
    range_s: float
    step_s: float


@dataclass(frozen=True)
class Call:
    function: str
    args: tuple[Node, ...]


@dataclass(frozen=True)
class Aggregate:
    op: str
    by: tuple[str, ...] | None
    expr: Node


@dataclass(frozen=True)
class Binary:
    """`left op right` between instant vectors, matched on identical labels."""

    op: str  # + - * /
    left: Node
    right: Node


Node = Selector | Ranged | Subquery | Call | Aggregate | Binary | float

_TOKEN = re.compile(
    r"""\s*(?:
    (?P<string>"(?:[^"\\]|\\.)*")
    |(?P<duration>\d+(?:ms|s|m|h|d))
    |(?P<number>\d+(?:\.\d*)?(?:[eE][-+]?\d+)?|\.\d+)
    |(?P<ident>[A-Za-z_][A-Za-z0-9_:]*)
    |(?P<punct>[{}()\[\],=/:+*-])
    )""",
    re.VERBOSE,
)
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
FUNCTIONS = frozenset({"rate", "deriv", "avg_over_time", "max_over_time", "histogram_quantile"})
AGGREGATIONS = frozenset({"sum", "avg"})
_PRECEDENCE = (("+", "-"), ("*", "/"))  # loosest first


def _tokens(query: str) -> list[tuple[str, str]]:
    out, pos = [], 0
    while pos < len(query.rstrip()):
        match = _TOKEN.match(query, pos)
        if match is None or match.end() == pos:
            raise PromQLError(f"cannot read {query[pos : pos + 20]!r} in {query!r}")
        kind = match.lastgroup
        assert kind is not None
        out.append((kind, match.group(kind)))
        pos = match.end()
    return out


def _seconds(duration: str) -> float:
    number = re.match(r"\d+", duration)
    assert number is not None
    return float(number.group()) * _UNITS[duration[number.end() :]]


class _Parser:
    def __init__(self, query: str) -> None:
        self.query = query
        self.tokens = _tokens(query)
        self.pos = 0

    def peek(self) -> tuple[str, str]:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else ("end", "")

    def take(self, text: str | None = None, kind: str | None = None) -> str:
        token_kind, token = self.peek()
        if (text is not None and token != text) or (kind is not None and token_kind != kind):
            want = text or kind
            raise PromQLError(f"expected {want!r}, found {token!r} in {self.query!r}")
        self.pos += 1
        return token

    def expression(self, level: int = 0) -> Node:
        """Binary operators left to right, tighter levels first (`* /` before `+ -`)."""
        if level == len(_PRECEDENCE):
            return self.postfix()
        node = self.expression(level + 1)
        while self.peek()[0] == "punct" and self.peek()[1] in _PRECEDENCE[level]:
            op = self.take()
            node = Binary(op, node, self.expression(level + 1))
        return node

    def postfix(self) -> Node:
        node = self.term()
        while self.peek() == ("punct", "["):
            self.take("[")
            range_s = _seconds(self.take(kind="duration"))
            if self.peek() == ("punct", ":"):
                self.take(":")
                node = Subquery(node, range_s, _seconds(self.take(kind="duration")))
            elif isinstance(node, Selector):
                node = Ranged(node, range_s)
            else:
                raise PromQLError(f"a range needs a selector in {self.query!r}")
            self.take("]")
        return node

    def term(self) -> Node:
        kind, token = self.peek()
        if kind == "number":
            self.pos += 1
            return float(token)
        if kind == "punct" and token == "(":
            self.take("(")
            node = self.expression()
            self.take(")")
            return node
        name = self.take(kind="ident")
        if name in AGGREGATIONS:
            by = None
            if self.peek() == ("ident", "by"):
                self.take("by")
                by = self._names()
            self.take("(")
            inner = self.expression()
            self.take(")")
            return Aggregate(name, by, inner)
        if name in FUNCTIONS and self.peek() == ("punct", "("):
            self.take("(")
            args = [self.expression()]
            while self.peek() == ("punct", ","):
                self.take(",")
                args.append(self.expression())
            self.take(")")
            return Call(name, tuple(args))
        return Selector(name, self._matchers())

    def _names(self) -> tuple[str, ...]:
        self.take("(")
        names = [self.take(kind="ident")]
        while self.peek() == ("punct", ","):
            self.take(",")
            names.append(self.take(kind="ident"))
        self.take(")")
        return tuple(names)

    def _matchers(self) -> tuple[tuple[str, str], ...]:
        if self.peek() != ("punct", "{"):
            return ()
        self.take("{")
        matchers = []
        while self.peek() != ("punct", "}"):
            label = self.take(kind="ident")
            self.take("=")
            raw = self.take(kind="string")
            matchers.append((label, re.sub(r"\\(.)", r"\1", raw[1:-1])))
            if self.peek() == ("punct", ","):
                self.take(",")
        self.take("}")
        return tuple(matchers)


def parse(query: str) -> Node:
    parser = _Parser(query)
    node = parser.expression()
    if parser.peek()[0] != "end":
        raise PromQLError(f"unexpected {parser.peek()[1]!r} in {query!r}")
    return node


# --------------------------------------------------------------------------------------------
# Evaluation (Prometheus 3's promql/functions.go and quantile.go, for floats)


def extrapolated_rate(samples: Sequence[Sample], start: float, end: float) -> float | None:
    """`rate()` of one counter over (start, end]: the increase between the first and last
    sample, counter resets added back, extrapolated towards the window's edges, per second.
    None with fewer than two samples (Prometheus then answers no series)."""
    if len(samples) < 2:
        return None
    (first_t, first_v), (last_t, _) = samples[0], samples[-1]
    increase = samples[-1][1] - first_v
    for (_, before), (_, after) in pairwise(samples):
        if after < before:
            increase += before
    sampled = last_t - first_t
    average = sampled / (len(samples) - 1)
    threshold = average * 1.1
    to_start = first_t - start
    to_end = end - last_t
    if to_start >= threshold:
        to_start = average / 2
    # A counter is never negative: extrapolate no further back than where it would be zero.
    if increase > 0 and first_v >= 0:
        to_start = min(to_start, sampled * (first_v / increase))
    if to_end >= threshold:
        to_end = average / 2
    factor = (sampled + to_start + to_end) / sampled
    factor /= end - start
    return increase * factor


def slope(samples: Sequence[Sample]) -> float | None:
    """`deriv()` of one gauge: the least-squares slope per second through its samples. None
    with fewer than two (Prometheus then answers no series)."""
    if len(samples) < 2:
        return None
    n = len(samples)
    mean_t = math.fsum(t for t, _ in samples) / n
    mean_v = math.fsum(v for _, v in samples) / n
    spread = math.fsum((t - mean_t) ** 2 for t, _ in samples)
    moved = math.fsum((t - mean_t) * (v - mean_v) for t, v in samples)
    return moved / spread if spread > 0 else None


def bucket_quantile(q: float, buckets: Sequence[tuple[float, float]]) -> float:
    """`histogram_quantile(q, ...)` of one histogram given as (upper bound, cumulative count)."""
    if math.isnan(q):
        return math.nan
    if q < 0:
        return -math.inf
    if q > 1:
        return math.inf
    merged: dict[float, float] = defaultdict(float)
    for bound, count in buckets:
        merged[bound] += count
    ordered = sorted(merged.items())
    if not ordered or not math.isinf(ordered[-1][0]) or len(ordered) < 2:
        return math.nan
    # Cumulative counts read at slightly different times can dip: take the running maximum.
    counts, top = [], -math.inf
    for _, count in ordered:
        top = max(top, count)
        counts.append(top)
    observations = counts[-1]
    if observations == 0 or math.isnan(observations):
        return math.nan
    rank = q * observations
    index = bisect.bisect_left(counts, rank)
    if index == len(ordered) - 1:
        return ordered[-2][0]
    if index == 0 and ordered[0][0] <= 0:
        return ordered[0][0]
    bucket_start, bucket_end, count = 0.0, ordered[index][0], counts[index]
    if index > 0:
        bucket_start = ordered[index - 1][0]
        count -= counts[index - 1]
        rank -= counts[index - 1]
    return bucket_start + (bucket_end - bucket_start) * (rank / count)


_OVER_TIME: dict[str, Callable[[list[float]], float]] = {
    "avg_over_time": lambda values: math.fsum(values) / len(values),
    # NaN samples count only when all are NaN
    "max_over_time": lambda values: max((v for v in values if not math.isnan(v)), default=math.nan),
}


class _Evaluator:
    def __init__(self, store: SimPrometheus, t: float) -> None:
        self.store = store
        self.t = t

    def eval(self, node: Node) -> Value:
        if isinstance(node, float):
            return node
        if isinstance(node, Selector):
            raise PromQLError(f"{node.name}: instant selectors are not supported here")
        if isinstance(node, Ranged):
            matchers = dict(node.selector.matchers)
            start = self.t - node.range_s
            return [
                (labels, samples)
                for labels, series in self.store.select(node.selector.name, matchers)
                if (samples := series.between(start, self.t))
            ]
        if isinstance(node, Subquery):
            return self._subquery(node)
        if isinstance(node, Call):
            return self._call(node)
        if isinstance(node, Aggregate):
            return self._aggregate(node)
        return self._binary(node)

    def _range(self, node: Node) -> RangeVector:
        value = self.eval(node)
        if isinstance(value, float) or (value and not isinstance(value[0][1], list)):
            raise PromQLError("a function over time needs a range")
        return value  # type: ignore[return-value]

    def instant(self, node: Node) -> InstantVector:
        value = self.eval(node)
        if isinstance(value, float) or (value and isinstance(value[0][1], list)):
            raise PromQLError("an instant vector was expected")
        return value  # type: ignore[return-value]

    def _subquery(self, node: Subquery) -> RangeVector:
        # Steps at absolute multiples of the step within (t - range, t].
        first = math.floor((self.t - node.range_s) / node.step_s + 1) * node.step_s
        points: dict[Labels, list[Sample]] = defaultdict(list)
        step_time = first
        while step_time <= self.t + 1e-9:
            for labels, v in _Evaluator(self.store, step_time).instant(node.expr):
                points[labels].append((step_time, v))
            step_time += node.step_s
        return list(points.items())

    def _call(self, node: Call) -> InstantVector:
        if node.function == "histogram_quantile":
            q = self.eval(node.args[0])
            if not isinstance(q, float):
                raise PromQLError("histogram_quantile takes a number first")
            groups: dict[Labels, list[tuple[float, float]]] = defaultdict(list)
            for labels, v in self.instant(node.args[1]):
                rest = tuple(item for item in labels if item[0] != "le")
                le = dict(labels).get("le")
                if le is not None:
                    groups[rest].append((float(le), v))
            return [(labels, bucket_quantile(q, buckets)) for labels, buckets in groups.items()]
        ranged = self._range(node.args[0])
        if node.function == "rate":
            start = self.t - _range_of(node.args[0])
            out = []
            for labels, samples in ranged:
                rate = extrapolated_rate(samples, start, self.t)
                if rate is not None:
                    out.append((labels, rate))
            return out
        if node.function == "deriv":
            return [
                (labels, change)
                for labels, samples in ranged
                if (change := slope(samples)) is not None
            ]
        over_time = _OVER_TIME[node.function]
        return [(labels, over_time([v for _, v in samples])) for labels, samples in ranged]

    def _aggregate(self, node: Aggregate) -> InstantVector:
        groups: dict[Labels, list[float]] = defaultdict(list)
        for labels, v in self.instant(node.expr):
            keep = node.by or ()
            groups[tuple(item for item in labels if item[0] in keep)].append(v)
        if node.op == "sum":
            return [(labels, math.fsum(values)) for labels, values in groups.items()]
        return [(labels, math.fsum(values) / len(values)) for labels, values in groups.items()]

    def _binary(self, node: Binary) -> InstantVector:
        if isinstance(node.right, float):  # a number applies to every sample
            return [(k, _arithmetic(node.op, v, node.right)) for k, v in self.instant(node.left)]
        if isinstance(node.left, float):
            return [(k, _arithmetic(node.op, node.left, v)) for k, v in self.instant(node.right)]
        right = dict(self.instant(node.right))
        return [
            (labels, _arithmetic(node.op, v, right[labels]))
            for labels, v in self.instant(node.left)
            if labels in right
        ]


def _arithmetic(op: str, a: float, b: float) -> float:
    """IEEE arithmetic as Go does it: x/0 is an infinity of x's sign, 0/0 NaN."""
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    if b == 0:
        return math.nan if a == 0 or math.isnan(a) else math.copysign(math.inf, a)
    return a / b


def _range_of(node: Node) -> float:
    if isinstance(node, Ranged | Subquery):
        return node.range_s
    raise PromQLError("rate() needs a range selector")
