"""The shared limit store: Redis, so every gateway replica enforces one limit.

Each admission and each settlement is ONE Lua script run atomically on the server, with
the server's own clock (``TIME``), so replicas whose clocks disagree still agree on
every window. The arithmetic is ``gateway.access.limits``' (GCRA for rpm and tpm, a
sorted set of expiring leases for max_parallel, a counter per UTC day for the token
budget, a counter of picodollars per budget period for the spend budget, its period
from ``gateway.access.periods``' calendar in Lua).
Keys share a hash tag per client key (``llmso:{team-a}:rpm``), so a cluster keeps one
client key's state on one shard.

``RedisStore`` owns one ``redis.asyncio`` client (a connection pool) for its lifetime;
calls time out after ``timeout`` seconds and are never retried here (the caller decides
what a failure means, see ``gateway.access.store``).
"""

from __future__ import annotations

from typing import Any

from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from gateway.access.limits import Ask, KeyLimits, Settlement, Verdict, gcra_window
from gateway.access.periods import CALENDAR_LUA, DAY

# KEYS: rpm tat, tpm tat, lease set, day counter prefix, spend counter prefix.
# ARGV: rpm, tpm, max_parallel, tokens_per_day (0 = none), cost, lease, lease ttl, peek,
# max_budget in picodollars (0 = none), budget period.
_ADMIT = (
    CALENDAR_LUA
    + """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local rpm, tpm = tonumber(ARGV[1]), tonumber(ARGV[2])
local par, budget = tonumber(ARGV[3]), tonumber(ARGV[4])
local cost, lease, ttl = tonumber(ARGV[5]), ARGV[6], tonumber(ARGV[7])
local W = 60.0
local day = tostring(math.floor(now / 86400))
local daykey = KEYS[4] .. day
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
local inflight = redis.call('ZCARD', KEYS[3])
local used = tonumber(redis.call('GET', daykey) or '0')
local rtat = tonumber(redis.call('GET', KEYS[1]) or '0')
local ttat = tonumber(redis.call('GET', KEYS[2]) or '0')
local maxspend, spent, resets = tonumber(ARGV[9]), '0', 0
if maxspend > 0 then
  local first, after = period_bounds(math.floor(now / 86400), ARGV[10])
  spent = redis.call('GET', KEYS[5] .. ARGV[10] .. ':' .. first) or '0'
  resets = after
end
local reason, wait = '', 0
if ARGV[8] == '0' then
  if budget > 0 and used >= budget then
    reason, wait = 'budget', 86400 - (now % 86400)
  elseif maxspend > 0 and tonumber(spent) >= maxspend then
    reason, wait = 'spend', resets * 86400 - now
  elseif par > 0 and inflight >= par then
    reason, wait = 'parallel', 1
  end
  local nr, nt = rtat, ttat
  if reason == '' and rpm > 0 then
    nr = math.max(rtat, now) + W / rpm
    if nr - now > W + 1e-9 then reason, wait = 'rpm', nr - now - W end
  end
  if reason == '' and tpm > 0 then
    nt = math.max(ttat, now) + cost * W / tpm
    if nt - now > W + 1e-9 then
      if cost > tpm then reason, wait = 'too_large', -1 else reason, wait = 'tpm', nt - now - W end
    end
  end
  if reason == '' then
    if rpm > 0 then
      redis.call('SET', KEYS[1], tostring(nr), 'PX', math.ceil((nr - now) * 1000) + 1000)
      rtat = nr
    end
    if tpm > 0 then
      redis.call('SET', KEYS[2], tostring(nt), 'PX', math.ceil((nt - now) * 1000) + 1000)
      ttat = nt
    end
    if par > 0 then
      redis.call('ZADD', KEYS[3], now + ttl, lease)
      redis.call('PEXPIRE', KEYS[3], math.ceil(ttl * 1000))
      inflight = inflight + 1
    end
    if budget > 0 then
      used = redis.call('INCRBY', daykey, cost)
      redis.call('EXPIRE', daykey, 172800)
    end
  end
end
return {reason, tostring(wait), tostring(rtat), tostring(ttat), tostring(now), used, inflight, day,
  spent, tostring(resets)}
"""
)

# KEYS: tpm tat, lease set, day counter, spend counter prefix.
# ARGV: tpm (0 = none), delta, lease, budget (0/1), cost in picodollars, budget period
# ('' = no max_budget). The cost goes to the period the request ends in.
_SETTLE = (
    CALENDAR_LUA
    + """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local tpm, delta = tonumber(ARGV[1]), tonumber(ARGV[2])
redis.call('ZREM', KEYS[2], ARGV[3])
if tpm > 0 and delta ~= 0 then
  local tat = tonumber(redis.call('GET', KEYS[1]) or '0')
  local new = math.max(now, math.max(tat, now) + delta * 60.0 / tpm)
  redis.call('SET', KEYS[1], tostring(new), 'PX', math.ceil((new - now) * 1000) + 1000)
end
if ARGV[4] == '1' and delta ~= 0 and redis.call('EXISTS', KEYS[3]) == 1 then
  if redis.call('INCRBY', KEYS[3], delta) < 0 then redis.call('SET', KEYS[3], 0, 'KEEPTTL') end
end
if ARGV[6] ~= '' and ARGV[5] ~= '0' then
  local first, after = period_bounds(math.floor(now / 86400), ARGV[6])
  local key = KEYS[4] .. ARGV[6] .. ':' .. first
  redis.call('INCRBY', key, ARGV[5])
  redis.call('EXPIRE', key, math.ceil(after * 86400 - now) + 86400)
end
return 1
"""
)


class RedisStore:
    """See the module docstring. Owned by the app's event loop."""

    def __init__(self, url: str, *, prefix: str, lease_ttl: float, timeout: float) -> None:
        self._client: Any = Redis.from_url(
            url,
            socket_timeout=timeout,
            socket_connect_timeout=timeout,
            retry=Retry(NoBackoff(), 0),
            health_check_interval=0,
        )
        self._prefix = prefix
        self._lease_ttl = lease_ttl
        self._admit = self._client.register_script(_ADMIT)
        self._settle = self._client.register_script(_SETTLE)

    def _keys(self, key: str) -> list[str]:
        base = f"{self._prefix}:{{{key}}}"
        return [f"{base}:rpm", f"{base}:tpm", f"{base}:par", f"{base}:day:", f"{base}:spend:"]

    async def admit(self, ask: Ask) -> Verdict:
        return await self._run(ask.key, ask.limits, ask.cost, ask.lease, peek=False)

    async def peek(self, key: str, limits: KeyLimits) -> Verdict:
        return await self._run(key, limits, 0, "", peek=True)

    async def settle(self, settlement: Settlement) -> None:
        limits = settlement.limits
        _, tpm_key, par_key, day_prefix, spend_prefix = self._keys(settlement.key)
        await self._settle(
            keys=[tpm_key, par_key, day_prefix + settlement.day, spend_prefix],
            args=[
                limits.tpm or 0,
                settlement.delta,
                settlement.lease,
                1 if limits.tokens_per_day else 0,
                settlement.cost,
                limits.budget_period if limits.max_budget else "",
            ],
        )

    async def close(self) -> None:
        await self._client.aclose()

    async def _run(
        self, key: str, limits: KeyLimits, cost: int, lease: str, *, peek: bool
    ) -> Verdict:
        reply = await self._admit(
            keys=self._keys(key),
            args=[
                limits.rpm or 0,
                limits.tpm or 0,
                limits.max_parallel or 0,
                limits.tokens_per_day or 0,
                cost,
                lease,
                self._lease_ttl,
                1 if peek else 0,
                limits.max_budget or 0,
                limits.budget_period,
            ],
        )
        reason = reply[0].decode() or None
        wait = float(reply[1])
        rpm_tat, tpm_tat, now = float(reply[2]), float(reply[3]), float(reply[4])
        return Verdict(
            allowed=reason is None,
            reason=reason,
            retry_after=float("inf") if wait < 0 else wait,
            requests=gcra_window(rpm_tat, now, limits.rpm) if limits.rpm else None,
            tokens=gcra_window(tpm_tat, now, limits.tpm) if limits.tpm else None,
            day=reply[7].decode(),
            day_used=int(reply[5]),
            inflight=int(reply[6]),
            spent=int(reply[8]),
            budget_resets_at=float(reply[9]) * DAY if limits.max_budget else 0.0,
        )
