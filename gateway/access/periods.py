"""The calendar periods of spend budgets, in UTC: a day, a week from Monday 00:00, a
month from the 1st.

A period is numbered by days since the epoch: ``bounds(now, kind)`` gives its first day
and the first day of the next one (its end, and when its budget resets). The Redis store
computes the same in Lua (``CALENDAR_LUA``, run on the Redis server's clock), and a test
holds the two equal day by day.
"""

from __future__ import annotations

from datetime import date, timedelta

from config.frontdoor import BudgetPeriod

DAY = 86400.0
_EPOCH = date(1970, 1, 1)


def bounds(now: float, kind: BudgetPeriod) -> tuple[int, int]:
    """``(first day, first day after)`` of the ``kind`` period holding the time ``now``."""
    day = int(now // DAY)
    if kind == "day":
        return day, day + 1
    if kind == "week":
        start = day - (day + 3) % 7  # 1970-01-01 was a Thursday: (day + 3) % 7 is 0 on Mondays
        return start, start + 7
    first = (_EPOCH + timedelta(days=day)).replace(day=1)
    following = (first + timedelta(days=32)).replace(day=1)
    return (first - _EPOCH).days, (following - _EPOCH).days


def label(kind: BudgetPeriod, start: int) -> str:
    """The period's name in the stores: ``month:20454``."""
    return f"{kind}:{start}"


CALENDAR_LUA = """
local function period_bounds(day, kind)
  if kind == 'day' then return day, day + 1 end
  if kind == 'week' then
    local start = day - (day + 3) % 7
    return start, start + 7
  end
  -- month: the civil date of `day` from its 400-year era (eras of 146097 days
  -- starting on 0000-03-01, so February ends each year), then the month's length
  local z = day + 719468
  local era = math.floor(z / 146097)
  local doe = z - era * 146097
  local yoe = math.floor((doe - math.floor(doe / 1460) + math.floor(doe / 36524)
    - math.floor(doe / 146096)) / 365)
  local doy = doe - (365 * yoe + math.floor(yoe / 4) - math.floor(yoe / 100))
  local mp = math.floor((5 * doy + 2) / 153)
  local dom = doy - math.floor((153 * mp + 2) / 5) + 1
  local month = mp < 10 and mp + 3 or mp - 9
  local year = yoe + era * 400
  if month <= 2 then year = year + 1 end
  local length = ({31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31})[month]
  if month == 2 and year % 4 == 0 and (year % 100 ~= 0 or year % 400 == 0) then
    length = 29
  end
  local start = day - dom + 1
  return start, start + length
end
"""
"""``period_bounds(day, kind)`` in Lua: ``bounds`` for the day number ``day``."""
