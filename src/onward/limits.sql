-- Limits by key (R5): a concurrency cap and a rate (calls per interval, spaced evenly) for a
-- connection, a provider or an organisation, shared by every process through PostgreSQL. Each
-- key's checks run under a transaction-scoped advisory lock keyed by it, so two processes
-- never both take the last slot or the same instant of the rate.

-- name: of_keys
-- The limits set for these keys (none: nothing to enforce, nothing to lock).
SELECT key, max_concurrent, calls, per_seconds FROM limits
WHERE org_id = (SELECT %(org_id)s::text) AND key = ANY (%(keys)s::text[])
ORDER BY key;

-- name: lock_key
-- Serialise the checks of one key for the rest of the transaction.
SELECT pg_advisory_xact_lock(hashtextextended('onward.limit:' || %(org_id)s || '/' || %(key)s, 0));

-- name: take_slot
-- Take a concurrency slot for this step's attempt if fewer than %(max)s are live: a slot is
-- live while its step is still running at that attempt with a lease that has not lapsed. Slots
-- of steps that moved on are removed on the way. Answers taken = false when the cap is full.
-- The steps' status is compared with `(SELECT 'running'::text)`, a value the planner does not
-- see: a literal would let it read a whole partial index that status implies
-- (steps_leased: every running step) for the few slots of a key,
-- whenever its statistics call that index nearly empty (tests/integration/test_batch_plans.py).
WITH gone AS (
    DELETE FROM limit_slots ls
    WHERE ls.org_id = (SELECT %(org_id)s::text) AND ls.key = %(key)s
      AND NOT EXISTS (
          SELECT 1 FROM steps s
          WHERE s.org_id = ls.org_id AND s.run_id = ls.run_id AND s.seq = ls.seq
            AND s.status = (SELECT 'running'::text) AND s.attempt = ls.attempt
            AND s.lease_until > now())
),
live AS (
    SELECT count(*) AS n FROM limit_slots ls
    JOIN steps s ON s.org_id = ls.org_id AND s.run_id = ls.run_id AND s.seq = ls.seq
    WHERE ls.org_id = (SELECT %(org_id)s::text) AND ls.key = %(key)s
      AND NOT (ls.run_id = %(run_id)s AND ls.seq = %(seq)s)
      AND s.status = (SELECT 'running'::text) AND s.attempt = ls.attempt
      AND s.lease_until > now()
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

-- name: booking
-- This step's booked instant under a rate, if it has one (it was held back before).
SELECT slot_at, extract(epoch FROM slot_at - clock_timestamp())::float8 AS wait_s
FROM limit_bookings
WHERE org_id = (SELECT %(org_id)s::text) AND key = %(key)s AND run_id = %(run_id)s AND seq = %(seq)s;

-- name: use_booking
-- The step's booked instant came: it goes if no call went less than an interval ago (a booked
-- step that came back late does not crowd the one before it); answers whether it went, and
-- otherwise how long until it may.
WITH went AS (
    UPDATE limits SET last_at = clock_timestamp()
    WHERE org_id = (SELECT %(org_id)s::text) AND key = %(key)s
      AND coalesce(last_at, '-infinity') + make_interval(secs => per_seconds / calls)
          <= clock_timestamp() + make_interval(secs => %(slack)s)
    RETURNING 1
),
used AS (
    DELETE FROM limit_bookings
    WHERE org_id = (SELECT %(org_id)s::text) AND key = %(key)s AND run_id = %(run_id)s AND seq = %(seq)s
      AND EXISTS (SELECT 1 FROM went)
)
SELECT EXISTS (SELECT 1 FROM went) AS went,
       extract(epoch FROM last_at + make_interval(secs => per_seconds / calls)
                          - clock_timestamp())::float8 AS wait_s
FROM limits WHERE org_id = (SELECT %(org_id)s::text) AND key = %(key)s;

-- name: take_call
-- The rate's next instant (by the database's clock): now if the rate allows a call now, else
-- next_at. Either way the one after it moves one interval on (per_seconds / calls), so calls
-- are spaced evenly and never come in bursts; a call that goes now is the last one (last_at).
-- Answers the instant and how far away it is.
UPDATE limits
SET next_at = greatest(coalesce(next_at, clock_timestamp()), clock_timestamp())
              + make_interval(secs => per_seconds / calls),
    last_at = CASE WHEN coalesce(next_at, '-infinity')
                        <= clock_timestamp() + make_interval(secs => %(slack)s)
                   THEN clock_timestamp() ELSE last_at END
WHERE org_id = (SELECT %(org_id)s::text) AND key = %(key)s AND calls IS NOT NULL
RETURNING next_at - make_interval(secs => per_seconds / calls) AS slot_at,
          extract(epoch FROM next_at - make_interval(secs => per_seconds / calls)
                         - clock_timestamp())::float8 AS wait_s;

-- name: book
-- Held back: the step's instant under the rate, for when it comes back.
INSERT INTO limit_bookings (org_id, key, run_id, seq, slot_at)
VALUES (%(org_id)s, %(key)s, %(run_id)s, %(seq)s, %(slot_at)s)
ON CONFLICT (org_id, key, run_id, seq) DO UPDATE SET slot_at = EXCLUDED.slot_at;

-- name: release_slots
-- The call is over: give its slots back at once (a lapsed lease would free them later).
DELETE FROM limit_slots
WHERE org_id = (SELECT %(org_id)s::text) AND run_id = %(run_id)s AND seq = %(seq)s AND attempt = %(attempt)s;

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
DELETE FROM limits WHERE org_id = (SELECT %(org_id)s::text) AND key = %(key)s RETURNING key;

-- name: list
-- Every key's limits, with the slots in use now (the status compared as in take_slot).
SELECT l.key, l.max_concurrent, l.calls, l.per_seconds,
       (SELECT count(*) FROM limit_slots ls
        JOIN steps s ON s.org_id = ls.org_id AND s.run_id = ls.run_id AND s.seq = ls.seq
        WHERE ls.org_id = l.org_id AND ls.key = l.key AND s.status = (SELECT 'running'::text)
          AND s.attempt = ls.attempt AND s.lease_until > now()) AS in_use
FROM limits l WHERE l.org_id = (SELECT %(org_id)s::text) ORDER BY l.key;
