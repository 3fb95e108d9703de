"""Per model: the cheapest replica count and batch cap that meet the SLOs at peak, what it
costs, and whether the model should stay resident or load on demand.

Search: every measured level ``B`` as ``max_num_seqs``, replicas ``r = 1..max_replicas``,
each replica offered ``peak / r`` (random or round-robin balancing splits a Poisson stream
into Poisson streams). The first ``r`` where some ``B`` meets every SLO with under 0.1 %
rejected wins; among its feasible ``B`` the one with the most capacity (burst headroom).

Resident vs lazy (``docs/plan.md``): a lazy model is unloaded after ``idle_ttl`` without
requests. With hourly Poisson rates, an hour at rate ``λ`` spends a share ``exp(-λ·ttl)``
of its time unloaded (``E[(gap - ttl)+] · λ``) and meets ``λ·3600·exp(-λ·ttl)`` cold
starts; hours at rate 0 are unloaded throughout. Lazy is chosen when it saves money and
either the cold start fits inside the TTFT SLO or under 1 % of requests meet one (so the
p95 and p99 still hold); otherwise resident.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from bench.plan.inputs import Curve, ModelProfile, Prices, Slo
from bench.plan.model import Prediction, predict

MAX_REJECT = 0.001
MAX_COLD_SHARE = 0.01


@dataclass(frozen=True, slots=True)
class Choice:
    replicas: int
    prediction: Prediction
    meets_slo: bool


@dataclass(slots=True)
class Recommendation:
    model: str
    system: str
    peak_rps: float
    feasible: bool
    choice: Choice
    tried: list[Choice]
    lazy: bool
    cold_start_s: float | None
    cold_start_source: str
    cold_share: float | None
    unloaded_hours_per_day: float
    resident_cost_per_day: float
    lazy_cost_per_day: float | None
    cost_per_day: float
    cost_per_million_output_tokens: float
    output_tokens_per_day: float
    headroom_tokens_per_s: float
    notes: list[str] = field(default_factory=list)

    def config_snippet(self, max_queue: int, idle_ttl: float) -> str:
        lines = [
            f"  - name: {self.model}",
            f"    max_num_seqs: {self.choice.prediction.max_num_seqs}",
            f"    max_queue: {max_queue}",
            f"    preload: {'false' if self.lazy else 'true'}",
        ]
        if self.lazy:
            lines.append(f"    idle_ttl: {idle_ttl:g}")
        lines.append(f"    # run {self.choice.replicas} replica(s) behind a balancer")
        return "\n".join(lines) + "\n"


def meets(prediction: Prediction, slo: Slo) -> bool:
    if prediction.reject_fraction > MAX_REJECT:
        return False
    if slo.ttft_p95_ms is not None and prediction.ttft_p95_s * 1000 > slo.ttft_p95_ms:
        return False
    return not (slo.e2e_p95_ms is not None and prediction.e2e_p95_s * 1000 > slo.e2e_p95_ms)


def search(curve: Curve, profile: ModelProfile, slo: Slo) -> tuple[bool, Choice, list[Choice]]:
    tried: list[Choice] = []
    for replicas in range(1, profile.max_replicas + 1):
        rate = profile.peak_rps / replicas
        here = [
            Choice(replicas, p, meets(p, slo))
            for p in (
                predict(
                    curve,
                    profile.output_tokens,
                    rate,
                    level.concurrency,
                    profile.max_queue,
                    prompt_tokens=profile.prompt_tokens,
                )
                for level in curve.levels
            )
        ]
        tried.extend(here)
        good = [c for c in here if c.meets_slo]
        if good:
            best = max(good, key=lambda c: (c.prediction.capacity_rps, -c.prediction.e2e_p95_s))
            return True, best, tried
    last = [c for c in tried if c.replicas == profile.max_replicas]
    return False, min(last, key=lambda c: c.prediction.e2e_p95_s), tried


def _lazy_terms(profile: ModelProfile) -> tuple[float, float]:
    """Unloaded hours per day and cold starts per day for a lazy model."""
    ttl = profile.idle_ttl_s
    hourly = profile.hourly
    unloaded = sum(1.0 if rate == 0 else math.exp(-rate * ttl) for rate in hourly)
    colds = sum(rate * 3600 * math.exp(-rate * ttl) for rate in hourly if rate > 0)
    # Each hour with traffic after an hour without starts cold once more.
    colds += sum(1 for h in range(24) if hourly[h] > 0 and hourly[h - 1] == 0)
    return unloaded, colds


def recommend(
    name: str,
    curve: Curve,
    profile: ModelProfile,
    *,
    slo: Slo,
    prices: Prices,
    cold_start: tuple[float | None, str],
) -> Recommendation:
    feasible, choice, tried = search(curve, profile, slo)
    notes = list(choice.prediction.notes)
    if not feasible:
        notes.append(
            f"no configuration up to {profile.max_replicas} replicas meets the SLO; "
            "shown: the best one tried"
        )
    if choice.prediction.queued_fraction > 0.01:
        notes.append(
            f"{choice.prediction.queued_fraction:.1%} of arrivals find max_num_seqs busy and "
            "queue (modelled as waiting, never as a larger batch than measured)"
        )
    requests_per_day = sum(rate * 3600 for rate in profile.hourly)
    tokens_per_day = requests_per_day * profile.output_tokens
    replicas = choice.replicas
    resident = replicas * 24 * prices.machine_hour
    unloaded, colds = _lazy_terms(profile)
    idle_price = prices.idle_machine_hour or 0.0
    lazy_cost = replicas * ((24 - unloaded) * prices.machine_hour + unloaded * idle_price)
    cold_s, cold_source = cold_start
    cold_share = colds / requests_per_day if requests_per_day else None
    lazy = False
    if cold_s is None:
        notes.append("no cold-start measurement: kept resident (scrape /metrics to decide)")
    elif lazy_cost < resident and cold_share is not None:
        fits = slo.ttft_p95_ms is not None and cold_s * 1000 <= slo.ttft_p95_ms
        lazy = fits or cold_share < MAX_COLD_SHARE
    cost = lazy_cost if lazy else resident
    capacity_tokens = replicas * choice.prediction.capacity_rps * profile.output_tokens
    return Recommendation(
        model=name,
        system=curve.system,
        peak_rps=profile.peak_rps,
        feasible=feasible,
        choice=choice,
        tried=tried,
        lazy=lazy,
        cold_start_s=cold_s,
        cold_start_source=cold_source,
        cold_share=cold_share,
        unloaded_hours_per_day=unloaded,
        resident_cost_per_day=resident,
        lazy_cost_per_day=lazy_cost if cold_s is not None else None,
        cost_per_day=cost,
        cost_per_million_output_tokens=cost / (tokens_per_day / 1e6),
        output_tokens_per_day=tokens_per_day,
        headroom_tokens_per_s=capacity_tokens - profile.peak_rps * profile.output_tokens,
        notes=notes,
    )
