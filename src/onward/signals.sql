-- Signals (R9): stored once by their identity, routed by a correlation key, consumed by the
-- step that waits on them in the transaction that wakes it. Every transition here runs with
-- the run's transition lock held (lock_run): a signal's intake and a step starting to wait are
-- ordered, so whichever comes second sees the other.

-- name: route
-- The run a correlation key leads to (recorded when the answered thing was created).
SELECT run_id, seq, step_id FROM correlations WHERE org_id = (SELECT %(org_id)s::text) AND key = %(key)s;

-- name: correlate
-- Record a correlation key for a run's step (idempotent), and adopt the signals that came
-- before it with that key and nobody to route them to: they become the run's pending signals.
WITH c AS (
    INSERT INTO correlations (org_id, key, run_id, seq, step_id)
    VALUES (%(org_id)s, %(key)s, %(run_id)s, %(seq)s, %(step_id)s)
    ON CONFLICT (org_id, key) DO NOTHING
    RETURNING run_id
)
UPDATE signals s SET run_id = %(run_id)s
WHERE s.org_id = (SELECT %(org_id)s::text) AND s.correlation_key = %(key)s AND s.run_id IS NULL
  AND s.status = 'pending'
RETURNING s.signal_id;

-- name: store
-- Store a signal under its identity; a transport duplicate only counts a delivery and
-- answers the stored row (created = false).
INSERT INTO signals AS s (org_id, signal_id, name, correlation_key, run_id, status, payload)
VALUES (%(org_id)s, %(signal_id)s, %(name)s, %(correlation_key)s, %(run_id)s, 'pending',
        %(payload)s)
ON CONFLICT (org_id, signal_id) DO UPDATE SET deliveries = s.deliveries + 1
RETURNING s.signal_id, s.name, s.run_id, s.status, s.reason, s.seq, s.deliveries,
          s.correlation_key, (s.xmax = 0) AS created;

-- name: lock_run
-- Take the run's transition lock for the rest of the transaction (an advisory lock keyed by
-- the run, not its row: a timer's fire updates the run's row while it holds its timer, and
-- intake waits for that timer, so the row lock would deadlock the two). Intake, a decision and
-- a step that starts to wait on signals or a person are ordered by it; the next statement's
-- snapshot sees what the other did. Answers the run (none: no such run).
SELECT pg_advisory_xact_lock(hashtextextended('onward.run:' || %(org_id)s || '/' || %(run_id)s, 0)),
       status, finished_at IS NOT NULL AS finished
FROM runs WHERE org_id = (SELECT %(org_id)s::text) AND run_id = %(run_id)s;

-- name: lock_deadline
-- Lock the deadline timer of the run's step that waits on signals, if it has not fired. A
-- fire holding it makes this wait, and then the fired row no longer matches: the deadline won.
-- Holding it, no fire can take the step (fire skips locked timers). "Unfired" is compared with
-- a value the planner does not see, as in timers.sql pending_of_run: a literal `IS NULL` would
-- let it read the organisation's every pending timer through timers_due (here and in consume).
SELECT t.timer_id FROM timers t
JOIN steps st ON st.org_id = t.org_id AND st.run_id = t.run_id AND st.seq = t.seq
WHERE t.org_id = (SELECT %(org_id)s::text) AND t.run_id = %(run_id)s AND t.purpose = 'deadline'
  AND t.fired_at IS NOT DISTINCT FROM (SELECT NULL::timestamptz) AND st.status = 'waiting'
  AND st.wait_kind = 'signal'
FOR UPDATE OF t;

-- name: consume
-- The run's step that waits on signals takes the oldest pending signal it names: the signal
-- is consumed, the step ready (woken by it) with an outbox wake, the deadline timer closed
-- as lost (fired_by 'signal'), the run active, one history row -- one statement.
WITH st AS (
    SELECT org_id, run_id, seq, step_id, signals FROM steps
    WHERE org_id = (SELECT %(org_id)s::text) AND run_id = %(run_id)s AND status = 'waiting'
      AND wait_kind = 'signal'
    FOR UPDATE
),
sig AS (
    -- the run's own pending signals (signals_pending by org and run, the parameters, never the
    -- whole index hashed against the step when its statistics call it nearly empty)
    SELECT s.signal_id, s.name, s.payload, st.seq FROM signals s
    JOIN st ON s.org_id = st.org_id AND s.run_id = st.run_id
    WHERE s.org_id = (SELECT %(org_id)s::text) AND s.run_id = %(run_id)s
      AND s.status = 'pending' AND s.name = ANY (st.signals)
    ORDER BY s.received_at, s.signal_id
    LIMIT 1
    FOR UPDATE OF s
),
c AS (
    UPDATE signals s SET status = 'consumed', consumed_at = now(), seq = sig.seq
    FROM sig
    WHERE s.org_id = (SELECT %(org_id)s::text) AND s.signal_id = sig.signal_id
    RETURNING s.signal_id, s.name, s.payload, s.seq, s.received_at
),
deadline AS (
    UPDATE timers t SET fired_at = now(), fired_by = 'signal'
    FROM c
    WHERE t.org_id = (SELECT %(org_id)s::text) AND t.run_id = %(run_id)s AND t.seq = c.seq
      AND t.purpose = 'deadline' AND t.fired_at IS NOT DISTINCT FROM (SELECT NULL::timestamptz)
    RETURNING t.timer_id
),
to_ready AS (
    SELECT %(org_id)s::text AS org_id, %(run_id)s::text AS run_id, c.seq,
           'waiting' AS from_status, NULL::int AS attempt, now() AS available_at,
           jsonb_build_object('by', 'signal', 'signal_id', c.signal_id, 'name', c.name,
                              'payload', c.payload, 'received_at', c.received_at) AS wake,
           NULL::jsonb AS error, 'signal_consumed' AS event, %(worker)s::text AS worker,
           jsonb_build_object('signal_id', c.signal_id, 'name', c.name,
                              'deadline_timer', (SELECT min(timer_id) FROM deadline),
                              'deadline', CASE WHEN EXISTS (SELECT 1 FROM deadline)
                                               THEN 'lost' END) AS detail
    FROM c
),
{{make_ready}},
run AS (
    UPDATE runs r SET status = 'active', updated_at = now()
    FROM ready
    WHERE r.org_id = ready.org_id AND r.run_id = ready.run_id AND r.status = ready.from_status
)
SELECT c.signal_id, c.name, c.seq, ready.step_id, ready.lane, ready.attempt
FROM c JOIN ready ON true;

-- name: settle_unconsumed
-- A signal no step took now: refused if its run has finished (or was cancelled); late if the
-- deadline of the step that waited on it already fired (the deadline won the race) and no
-- step waits on it now. Either way its run's history says so. Otherwise it stays pending.
WITH r AS (
    SELECT status, finished_at IS NOT NULL AS finished FROM runs
    WHERE org_id = (SELECT %(org_id)s::text) AND run_id = %(run_id)s
),
lost_to AS (
    SELECT t.timer_id, t.seq FROM timers t
    WHERE t.org_id = (SELECT %(org_id)s::text) AND t.run_id = %(run_id)s AND t.purpose = 'deadline'
      AND t.fired_by IN ('wake', 'sweep') AND t.intent -> 'signals' ? %(name)s
      AND NOT EXISTS (
          SELECT 1 FROM steps st
          WHERE st.org_id = t.org_id AND st.run_id = t.run_id AND st.status = 'waiting'
            AND st.wait_kind = 'signal' AND %(name)s = ANY (st.signals))
    ORDER BY t.timer_id DESC
    LIMIT 1
),
verdict AS (
    SELECT CASE WHEN r.finished OR r.status = 'cancelled' THEN 'refused'
                WHEN EXISTS (SELECT 1 FROM lost_to) THEN 'late' END AS status,
           CASE WHEN r.finished OR r.status = 'cancelled' THEN 'the run is ' || r.status
                ELSE 'the deadline of step ' || (SELECT seq FROM lost_to)
                     || ' fired first (timer ' || (SELECT timer_id FROM lost_to) || ')' END
               AS reason
    FROM r
),
u AS (
    UPDATE signals s SET status = v.status, reason = v.reason
    FROM verdict v
    -- by its key: a literal 'pending' would let the planner read the organisation's every
    -- pending signal through signals_pending (tests/integration/test_batch_plans.py)
    WHERE s.org_id = (SELECT %(org_id)s::text) AND s.signal_id = %(signal_id)s
      AND s.status = (SELECT 'pending'::text) AND v.status IS NOT NULL
    RETURNING s.signal_id, s.run_id, s.status, s.reason, s.name
),
hist AS (
    INSERT INTO history_log (org_id, run_id, event, worker, detail)
    SELECT %(org_id)s, u.run_id, 'signal_' || u.status, %(worker)s,
           jsonb_build_object('signal_id', u.signal_id, 'name', u.name, 'reason', u.reason)
    FROM u
)
SELECT status, reason FROM u;

-- name: read
-- One signal as stored.
SELECT signal_id, name, correlation_key, run_id, status, reason, seq, deliveries, payload,
       received_at, consumed_at
FROM signals WHERE org_id = (SELECT %(org_id)s::text) AND signal_id = %(signal_id)s;

-- name: list
-- A page of an organisation's signals, newest first, narrowed by run, status or unrouted (a
-- pending signal nobody can route is shown as `unrouted`).
SELECT signal_id, name, correlation_key, run_id,
       CASE WHEN run_id IS NULL AND status = 'pending' THEN 'unrouted' ELSE status END AS status,
       reason, seq, deliveries, received_at, consumed_at
FROM signals
WHERE org_id = (SELECT %(org_id)s::text)
  AND (%(run_id)s::text IS NULL OR run_id = %(run_id)s)
  AND (%(status)s::text IS NULL OR status = %(status)s)
  AND (NOT %(unrouted)s OR (run_id IS NULL AND status = 'pending'))
ORDER BY received_at DESC, signal_id
LIMIT %(limit)s;

-- name: unrouted
-- Signals nobody could route, kept older than the bound: how many, and the oldest (doctor).
SELECT count(*) AS unrouted, min(received_at) AS oldest
FROM signals
WHERE run_id IS NULL AND status = 'pending'
  AND received_at < now() - make_interval(secs => %(grace)s);
