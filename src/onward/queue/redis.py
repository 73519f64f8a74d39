"""Wake-ups over Redis with BullMQ semantics: delayed jobs and job-id dedup (R2, R7, R16).

Why redis-py directly and not the ``bullmq`` package: bullmq 3.4.4 for Python rounds
sub-second delays up to one second, silently drops a job whose id matches a retained
*completed* job (so a wake is lost without an error), never checks the eviction policy, and
pins exact versions of croniter, msgpack and semver that clash with other dependencies. What
onward needs from BullMQ is small -- a dedup marker per job id, a delayed set, a ready list --
so two short Lua scripts over redis-py's asyncio client give the same semantics with none of
those problems, and the dedup rule is explicit here instead of hidden in a library.

Key layout (``<prefix>`` defaults to ``onward``)::

    <prefix>:job:<job_id>     string "1", TTL delay + ``retention_s``: the dedup marker
    <prefix>:ready:<lane>     LIST of ``Wake.to_json()`` payloads; LPUSH in, BRPOP out
    <prefix>:delayed:<lane>   ZSET of payloads scored by due time (ms, Redis server clock)

Publishing a wake whose job id is still retained does nothing, as BullMQ does with a kept id.
That is what makes a relay that republishes after a crash harmless, and it is why wake ids
carry the attempt or wake number (``onward.ids``): a retry is a new id, not a duplicate.

Due times come from Redis ``TIME`` inside the scripts, never from a client clock, so workers
with drifting clocks agree on when a delayed wake is due (a publish sends only durations: each
delay, less the time the publish spent building its batch). Consumers promote due delayed jobs
of their lanes to the ready lists and take up to ``take_batch`` ready jobs in the same script
(one round trip for a burst of due timers, not two per wake), then block on the lists for at
most ``block_s`` (0.5 s), or until one Redis server tick before the earliest delayed job is
due, and wait the rest in short slices (a BRPOP times out only at a server tick: 100 ms at the
default ``hz``). A delayed wake is therefore delivered at its due time, at most ~``block_s``
late when it was published while every consumer was already blocked; it is never delivered
early.

A wake popped by a consumer that dies before handling it is lost: wakes are hints, and the
worker's polling and the due sweep (R7) recover. Redis must run ``maxmemory-policy
noeviction`` (R16): with any other policy Redis deletes keys under memory pressure, and the
jobs vanish exactly when the system is busiest. ``start()`` refuses other policies unless
``allow_eviction=True``. Requires Redis >= 6.0 (fractional BRPOP timeouts, effect-replicated
scripts). On Redis Cluster every key must live in one slot: use a hash-tagged prefix such as
``{onward}``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import random
import time
from collections.abc import Sequence
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff, NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from onward.errors import QueueMisconfigured
from onward.queue.base import OnReconnect, OnWake, Queue, Wake

log = logging.getLogger("onward.queue.redis")

# KEYS: per wake, its job marker, ready list and delayed zset. ARGV: the milliseconds the
# client spent since the delays were measured, then per wake its payload, delay ms and marker
# TTL ms. One script for a batch of wakes reads Redis TIME once and takes the client's time off
# every delay (never more: the batch reaches Redis after it was measured, so a wake is never
# due early). A script per wake scored each from its own execution, after the client had built
# every command before it and Redis had run them: the wakes of a 2,000-wake batch were due
# 36-53 ms after their instant. Redis does not roll back a script that fails half way, so each
# wake's marker is written after its push: a failed push leaves no marker (the relay's retry
# is not swallowed), and a failure after it can at worst let a retry deliver the wake twice,
# which is harmless; the wakes before it stay published, and their markers absorb the retry.
_PUBLISH = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000
local spent = tonumber(ARGV[1])
local published = 0
for i = 1, #KEYS, 3 do
  if redis.call('EXISTS', KEYS[i]) == 0 then
    local delay = tonumber(ARGV[i + 2])
    if delay > 0 and delay - spent > 0 then
      redis.call('ZADD', KEYS[i + 2], now + delay - spent, ARGV[i + 1])
    else
      redis.call('LPUSH', KEYS[i + 1], ARGV[i + 1])
    end
    redis.call('SET', KEYS[i], '1', 'PX', ARGV[i + 3])
    published = published + 1
  end
end
return published
"""
#: wakes a publishing script carries: Redis runs one script at a time, so a bounded batch keeps
#: other clients' commands from waiting long behind it
_PUBLISH_CHUNK = 256

# KEYS: delayed zset, ready list, delayed zset, ready list, ... ARGV: max jobs moved per lane,
# max jobs taken in all. Promotes each lane's due delayed jobs to its ready list, then takes
# ready jobs, lane by lane in the order given (the caller rotates it, so no lane starves).
# Returns {ms until the earliest remaining delayed job is due (-1: none), {jobs taken}}.
_TAKE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000
local limit = tonumber(ARGV[1])
local take = tonumber(ARGV[2])
local wait = -1
for i = 1, #KEYS, 2 do
  local due = redis.call('ZRANGEBYSCORE', KEYS[i], '-inf', now, 'LIMIT', 0, limit)
  if #due > 0 then
    for _, job in ipairs(due) do
      redis.call('LPUSH', KEYS[i + 1], job)
    end
    redis.call('ZREM', KEYS[i], unpack(due))
  end
  local head = redis.call('ZRANGE', KEYS[i], 0, 0, 'WITHSCORES')
  if head[2] then
    local w = math.max(0, math.ceil(tonumber(head[2]) - now))
    if wait < 0 or w < wait then
      wait = w
    end
  end
end
local jobs = {}
for i = 2, #KEYS, 2 do
  while #jobs < take do
    local job = redis.call('RPOP', KEYS[i])
    if not job then
      break
    end
    jobs[#jobs + 1] = job
  end
end
return {wait, jobs}
"""

_BACKOFF_START_S = 0.1
_BACKOFF_MAX_S = 5.0
_MIN_BLOCK_S = 0.01  # BRPOP's timeout 0 means "forever": never ask for less than this
# Redis times a blocked BRPOP out at its next server tick, not at the timeout asked for: up to
# 1/hz late (100 ms at the default hz 10; measured: a 10 ms BRPOP returns after ~100 ms). A
# consumer that blocked until the next delayed job is due would deliver it that late, so it
# blocks until one tick before, and waits the last stretch here, in slices, taking again after
# each (an immediate wake then waits at most one slice).
_SERVER_TICK_S = 0.1
_SLICE_S = 0.01
_OP_TIMEOUT_S = 10.0  # a Redis round trip that takes longer is treated as a lost connection

# Timeouts: the clients run with socket_timeout=None and every call is wrapped in
# asyncio.timeout() instead. With a socket_timeout, redis-py wraps each socket write in
# asyncio.wait_for, which on Python 3.11 returns normally and DROPS a cancel() that lands in
# the same loop turn as the write completing (bpo-42130, fixed in 3.12): a cancelled consumer
# then loops forever and a worker's shutdown hangs. asyncio.timeout does not lose cancels.


def _raise_if_cancel_was_swallowed() -> None:
    """Belt and braces for the above: ``Task.cancelling()`` still counts a dropped cancel."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


class RedisQueue(Queue):
    name = "redis"
    supports_delay = True

    def __init__(
        self,
        url: str,
        prefix: str = "onward",
        allow_eviction: bool = False,
        retention_s: float = 86400.0,
        *,
        block_s: float = 0.5,
        promote_batch: int = 100,
        take_batch: int = 100,
    ) -> None:
        self.url = url
        self.prefix = prefix
        self.allow_eviction = allow_eviction
        self.retention_s = retention_s
        self.block_s = block_s
        self.promote_batch = promote_batch
        self.take_batch = take_batch
        self._client: aioredis.Redis | None = None
        self._warned_config = False  # health() runs often: say "CONFIG refused" once

    # -- keys -------------------------------------------------------------------------------

    def job_key(self, job_id: str) -> str:
        return f"{self.prefix}:job:{job_id}"

    def ready_key(self, lane: str) -> str:
        return f"{self.prefix}:ready:{lane}"

    def delayed_key(self, lane: str) -> str:
        return f"{self.prefix}:delayed:{lane}"

    # -- connections ------------------------------------------------------------------------

    def _shared(self) -> aioredis.Redis:
        # Created lazily so the client binds to the running event loop. A few retries are safe
        # for publish: a repeated script finds its own dedup marker and does nothing.
        if self._client is None:
            self._client = aioredis.Redis.from_url(
                self.url,
                decode_responses=True,
                socket_timeout=None,  # see _OP_TIMEOUT_S
                socket_connect_timeout=5.0,
                retry=Retry(ExponentialBackoff(cap=1.0, base=0.05), 3),
            )
        return self._client

    def _dedicated(self) -> aioredis.Redis:
        # One connection per consumer, without redis-py's silent retries: the consumer must
        # see every reconnect to call on_reconnect. The name lets operators (and tests) find
        # it in CLIENT LIST.
        return aioredis.Redis.from_url(
            self.url,
            decode_responses=True,
            single_connection_client=True,
            socket_timeout=None,  # see _OP_TIMEOUT_S
            socket_connect_timeout=5.0,
            retry=Retry(NoBackoff(), 0),
            client_name=f"{self.prefix}:consumer",
        )

    def _where(self) -> str:
        # Never echo the URL: it may carry a password.
        kw = self._shared().connection_pool.connection_kwargs
        if "path" in kw:
            return f"unix:{kw['path']}"
        return f"{kw.get('host', '?')}:{kw.get('port', '?')}/{kw.get('db', 0)}"

    # -- configuration checks ---------------------------------------------------------------

    async def _eviction_policy(self) -> str | None:
        """The server's maxmemory-policy, or None when this client may not read it."""
        client = self._shared()
        try:
            config: dict[Any, Any] = await client.config_get("maxmemory-policy")
            policy = config.get("maxmemory-policy")
            if policy:
                return str(policy)
        except ResponseError as exc:  # NOPERM (ACL) or CONFIG renamed away (managed Redis)
            if not self._warned_config:
                self._warned_config = True
                log.warning(
                    "CONFIG GET is not permitted on Redis at %s (%s) -- usual on managed Redis; "
                    "reading maxmemory-policy from INFO instead",
                    self._where(),
                    exc,
                )
        try:
            info: dict[str, Any] = await client.info("memory")
        except ResponseError:
            return None
        policy = info.get("maxmemory_policy")
        return str(policy) if policy else None

    def _eviction_problem(self, policy: str) -> str:
        return (
            f"Redis at {self._where()} has maxmemory-policy {policy!r}: set "
            "`maxmemory-policy noeviction` (redis.conf, CONFIG SET, or the provider's parameter "
            "group). Any other policy lets Redis delete keys under memory pressure, so wake "
            "jobs and dedup markers vanish exactly when the system is busiest"
        )

    async def start(self) -> None:
        async with asyncio.timeout(_OP_TIMEOUT_S):
            await self._shared().ping()
            policy = await self._eviction_policy()
        if policy is None:
            log.warning(
                "cannot read maxmemory-policy on Redis at %s (CONFIG and INFO refused): make "
                "sure it is `noeviction`, or wake jobs may be evicted under memory pressure",
                self._where(),
            )
        elif policy != "noeviction":
            problem = self._eviction_problem(policy)
            if not self.allow_eviction:
                raise QueueMisconfigured(problem)
            log.warning("%s. Continuing anyway because allow_eviction=True.", problem)

    async def health(self) -> list[str]:
        try:
            async with asyncio.timeout(_OP_TIMEOUT_S):
                await self._shared().ping()
                policy = await self._eviction_policy()
        except (RedisError, OSError, TimeoutError) as exc:
            return [f"Redis at {self._where()} is unreachable: {exc or type(exc).__name__}"]
        if policy is None:
            return [f"cannot verify maxmemory-policy of Redis at {self._where()}"]
        if policy != "noeviction":
            allowed = " (allowed by allow_eviction)" if self.allow_eviction else ""
            return [self._eviction_problem(policy) + allowed]
        return []

    # -- publish ----------------------------------------------------------------------------

    async def publish(self, wakes: Sequence[Wake]) -> None:
        if not wakes:
            return
        try:
            await self._publish(wakes)
        except RedisError as exc:
            # redis-py's errors are not OSError/ConnectionError, which is what the relay
            # treats as "leave the rows unsent and retry". That includes OOM refusals: under
            # noeviction a full Redis refuses writes instead of dropping keys, as it should.
            raise ConnectionError(f"Redis at {self._where()} refused the wakes: {exc}") from exc

    async def _publish(self, wakes: Sequence[Wake]) -> None:
        client = self._shared()
        script = client.register_script(_PUBLISH)
        retention_ms = self.retention_s * 1000.0
        # Not a MULTI: each script is atomic on its own, and a batch that fails half way is
        # republished by the relay, where the dedup markers absorb the half that got through.
        # A round trip a chunk, not one pipeline: each chunk's script is told the time spent
        # since this call began (its own building and the chunks before it) and takes it off.
        began = time.monotonic()
        async with asyncio.timeout(_OP_TIMEOUT_S):
            for i in range(0, len(wakes), _PUBLISH_CHUNK):
                keys: list[str] = []
                args: list[str] = []
                for w in wakes[i : i + _PUBLISH_CHUNK]:
                    delay_ms = max(0.0, w.delay_s * 1000.0)
                    # The marker outlives the job by retention_s, like a kept completed BullMQ
                    # job, so a delayed wake stays deduplicated after it has been delivered too.
                    ttl_ms = max(1, math.ceil(delay_ms + retention_ms))
                    keys += (
                        self.job_key(w.job_id),
                        self.ready_key(w.lane),
                        self.delayed_key(w.lane),
                    )
                    args += (w.to_json(), repr(delay_ms), str(ttl_ms))
                spent_ms = (time.monotonic() - began) * 1000.0
                await script(keys=keys, args=[repr(spent_ms), *args], client=client)

    # -- consume ----------------------------------------------------------------------------

    async def consume(
        self, lanes: Sequence[str], on_wake: OnWake, on_reconnect: OnReconnect | None = None
    ) -> None:
        lanes = list(dict.fromkeys(lanes))
        if not lanes:
            await asyncio.Event().wait()  # nothing to consume; returns only when cancelled
        backoff = _BACKOFF_START_S
        lost = False
        turn = 0
        while True:
            conn = self._dedicated()
            try:
                async with asyncio.timeout(_OP_TIMEOUT_S):
                    await conn.ping()
                _raise_if_cancel_was_swallowed()
                if lost:
                    log.info("wake consumer reconnected to Redis at %s", self._where())
                    if on_reconnect is not None:
                        on_reconnect()
                lost, backoff = False, _BACKOFF_START_S
                take = conn.register_script(_TAKE)
                while True:
                    # Rotate the lanes: jobs are taken (and BRPOP serves) in list order, so a
                    # fixed order would let one busy lane starve the others.
                    turn = (turn + 1) % len(lanes)
                    order = lanes[turn:] + lanes[:turn]
                    keys = [
                        k for lane in order for k in (self.delayed_key(lane), self.ready_key(lane))
                    ]
                    async with asyncio.timeout(self.block_s + _OP_TIMEOUT_S):
                        wait_ms, jobs = await take(
                            keys=keys, args=[self.promote_batch, self.take_batch], client=conn
                        )
                        for raw in jobs:
                            self._deliver(raw, on_wake)
                        _raise_if_cancel_was_swallowed()
                        if len(jobs) >= self.take_batch:
                            continue  # more may be ready
                        wait = int(wait_ms) / 1000 if int(wait_ms) >= 0 else None
                        if wait is not None and wait < _SERVER_TICK_S + _MIN_BLOCK_S:
                            await asyncio.sleep(min(wait, _SLICE_S))
                            continue
                        timeout = self.block_s
                        if wait is not None:
                            timeout = min(timeout, wait - _SERVER_TICK_S)
                        item = await conn.brpop(
                            [self.ready_key(lane) for lane in order], timeout=timeout
                        )
                    if item is not None:
                        self._deliver(item[1], on_wake)
                    _raise_if_cancel_was_swallowed()
            except (RedisConnectionError, RedisTimeoutError, OSError, TimeoutError) as exc:
                log.warning("wake consumer lost Redis at %s (%s); reconnecting", self._where(), exc)
                lost = True
            except RedisError as exc:
                log.error(
                    "wake consumer error from Redis at %s: %s; reconnecting", self._where(), exc
                )
                lost = True
            finally:
                with contextlib.suppress(RedisError, OSError):
                    await conn.aclose()
            await asyncio.sleep(backoff * (0.5 + random.random()))
            backoff = min(backoff * 2, _BACKOFF_MAX_S)

    def _deliver(self, raw: str | bytes, on_wake: OnWake) -> None:
        try:
            wake = Wake.from_json(raw)
        except (ValueError, KeyError, TypeError):
            log.warning("ignoring malformed wake %r", raw[:200])
            return
        try:
            on_wake(wake)
        except Exception:
            # A raising handler must not stop the consumer: a dead consumer is a silent
            # failure (R16). The wake is a hint; polling and the sweep recover it.
            log.exception("on_wake failed for wake %s", wake.job_id)

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None
