-- Limits by key (R5): a concurrency cap and a rate (calls per interval) for a connection, a
-- provider or an organisation, shared by every process through PostgreSQL. Each key's checks
-- run under a transaction-scoped advisory lock keyed by it, so two processes never both take
-- the last slot or the last call of a window.

-- name: of_keys
-- The limits set for these keys (none: nothing to enforce, nothing to lock).
SELECT key, max_concurrent, calls, per_seconds FROM limits
WHERE org_id = %(org_id)s AND key = ANY (%(keys)s::text[])
ORDER BY key;

-- name: lock_key
-- Serialise the checks of one key for the rest of the transaction.
SELECT pg_advisory_xact_lock(hashtextextended('onward.limit:' || %(org_id)s || '/' || %(key)s, 0));

-- name: take_slot
-- Take a concurrency slot for this step's attempt if fewer than %(max)s are live: a slot is
-- live while its step is still running at that attempt with a lease that has not lapsed. Slots
-- of steps that moved on are removed on the way. Answers taken = false when the cap is full.
WITH gone AS (
    DELETE FROM limit_slots ls
    WHERE ls.org_id = %(org_id)s AND ls.key = %(key)s
      AND NOT EXISTS (
          SELECT 1 FROM steps s
          WHERE s.org_id = ls.org_id AND s.run_id = ls.run_id AND s.seq = ls.seq
            AND s.status = 'running' AND s.attempt = ls.attempt AND s.lease_until > now())
),
live AS (
    SELECT count(*) AS n FROM limit_slots ls
    JOIN steps s ON s.org_id = ls.org_id AND s.run_id = ls.run_id AND s.seq = ls.seq
    WHERE ls.org_id = %(org_id)s AND ls.key = %(key)s
      AND NOT (ls.run_id = %(run_id)s AND ls.seq = %(seq)s)
      AND s.status = 'running' AND s.attempt = ls.attempt AND s.lease_until > now()
),
ins AS (
    INSERT INTO limit_slots (org_id, key, run_id, seq, attempt)
    SELECT %(org_id)s, %(key)s, %(run_id)s, %(seq)s, %(attempt)s
    FROM live WHERE live.n < %(max)s
    ON CONFLICT (org_id, key, run_id, seq) DO UPDATE SET attempt = EXCLUDED.attempt,
                                                        acquired_at = now()
    RETURNING 1
)
SELECT EXISTS (SELECT 1 FROM ins) AS taken, (SELECT n FROM live) AS in_use;

-- name: take_call
-- Count a call in the key's sliding window if fewer than %(calls)s fall in the last
-- %(per)s seconds (by the database's clock). Otherwise answers how long until the oldest call
-- of the window leaves it: the caller's step waits that long, outside any lease.
WITH pruned AS (
    DELETE FROM limit_calls
    WHERE org_id = %(org_id)s AND key = %(key)s
      AND at <= clock_timestamp() - make_interval(secs => %(per)s)
),
window_ AS (
    SELECT count(*) AS n, min(at) AS oldest FROM limit_calls
    WHERE org_id = %(org_id)s AND key = %(key)s
      AND at > clock_timestamp() - make_interval(secs => %(per)s)
),
ins AS (
    INSERT INTO limit_calls (org_id, key)
    SELECT %(org_id)s, %(key)s FROM window_ WHERE window_.n < %(calls)s
    RETURNING at
)
SELECT EXISTS (SELECT 1 FROM ins) AS taken,
       greatest(0.0, extract(epoch FROM (SELECT oldest FROM window_)
                                       + make_interval(secs => %(per)s) - clock_timestamp()))::float8
           AS wait_s;

-- name: release_slots
-- The call is over: give its slots back at once (a lapsed lease would free them later).
DELETE FROM limit_slots
WHERE org_id = %(org_id)s AND run_id = %(run_id)s AND seq = %(seq)s AND attempt = %(attempt)s;

-- name: set_limit
-- Set (or replace) a key's limits; NULLs remove that part.
INSERT INTO limits (org_id, key, max_concurrent, calls, per_seconds)
VALUES (%(org_id)s, %(key)s, %(max_concurrent)s, %(calls)s, %(per_seconds)s)
ON CONFLICT (org_id, key) DO UPDATE
SET max_concurrent = EXCLUDED.max_concurrent, calls = EXCLUDED.calls,
    per_seconds = EXCLUDED.per_seconds, updated_at = now()
RETURNING key, max_concurrent, calls, per_seconds;

-- name: remove_limit
-- No limits for this key any more.
DELETE FROM limits WHERE org_id = %(org_id)s AND key = %(key)s RETURNING key;

-- name: list
-- Every key's limits, with the slots in use now.
SELECT l.key, l.max_concurrent, l.calls, l.per_seconds,
       (SELECT count(*) FROM limit_slots ls
        JOIN steps s ON s.org_id = ls.org_id AND s.run_id = ls.run_id AND s.seq = ls.seq
        WHERE ls.org_id = l.org_id AND ls.key = l.key AND s.status = 'running'
          AND s.attempt = ls.attempt AND s.lease_until > now()) AS in_use
FROM limits l WHERE l.org_id = %(org_id)s ORDER BY l.key;
