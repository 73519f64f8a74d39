-- Timers (R6, R7): a timer row stores what was asked (intent) and the computed UTC instant
-- (due_at). It is fired exactly once, by whichever comes first: its delayed wake job (fast
-- path) or the due sweep (backstop). fired_at IS NULL is the claim.

-- name: fire
-- Fire the given timers if still unfired: the waiting step becomes ready (woken by the timer),
-- the run active, and an outbox row wakes a worker of the step's lane. Idempotent: a duplicate
-- wake or a timer already fired by the sweep changes nothing. The timers are locked in one
-- order with SKIP LOCKED, so a wake and the sweep firing at the same moment never wait on each
-- other (one of them fires each timer; the sweep's own locks do not block its own fire). A
-- wake names its wake number: the wake of a timer recomputed since (wake_n moved on) does
-- nothing; the sweep names none and fires what is due.
-- Eager: a worker firing on the wake names the lanes it serves with their free slots
-- (%(lanes)s, %(free)s, %(leases)s; the sweep names none). Up to that many woken steps of each
-- lane are claimed by %(worker)s in this statement instead of made ready -- running, attempt + 1
-- (the fence), its lane's lease, no outbox wake -- as leases.sql settle_advance inserts an
-- eager successor, and returned as leases.sql claim returns a claim, so the worker runs them
-- at once: no wake round trip and no second claim. The history row is the same `timer_fired`.
WITH picked AS (
    -- one primary-key lookup per named timer, whatever the statistics say (a Monday burst is
    -- exactly when they are stale), in one order, skipping timers another fire holds
    SELECT t.org_id, t.timer_id
    FROM (SELECT * FROM unnest(%(org_ids)s::text[], %(timer_ids)s::bigint[], %(wake_ns)s::int[])
                           AS u(org_id, timer_id, wake_n)
          ORDER BY org_id, timer_id) AS x
    CROSS JOIN LATERAL (
        -- by the key alone (no fired_at here: that would invite the partial timers_due index,
        -- which stale statistics make the planner scan per timer)
        SELECT timers.org_id, timers.timer_id, timers.fired_at, timers.wake_n FROM timers
        WHERE timers.org_id = x.org_id AND timers.timer_id = x.timer_id
        OFFSET 0  -- a fence: keeps the outer filter from being pushed in here
        FOR UPDATE SKIP LOCKED
    ) AS t
    WHERE t.fired_at IS NULL AND (x.wake_n IS NULL OR t.wake_n = x.wake_n)
),
f AS (
    UPDATE timers t SET fired_at = now(), fired_by = %(by)s
    FROM picked p
    WHERE t.org_id = p.org_id AND t.timer_id = p.timer_id
    RETURNING t.org_id, t.timer_id, t.run_id, t.seq, t.due_at, t.fired_at, t.purpose
),
woken AS (
    -- each fired timer's waiting step, what woke it and the history row's detail; numbered
    -- within its lane (earliest due first) against the firing worker's free slots
    SELECT f.org_id, f.timer_id, f.run_id, f.seq, st.lane,
           jsonb_build_object('by', 'timer', 'timer_id', f.timer_id, 'due_at', f.due_at,
                              'purpose', f.purpose) AS wake,
           jsonb_build_object('timer_id', f.timer_id, 'by', %(by)s::text, 'due_at', f.due_at,
                              'lateness_ms',
                              round(extract(epoch FROM f.fired_at - f.due_at) * 1000)::bigint)
               AS detail,
           row_number() OVER (PARTITION BY st.lane ORDER BY f.due_at, f.timer_id) AS nth
    FROM f JOIN steps st ON st.org_id = f.org_id AND st.run_id = f.run_id AND st.seq = f.seq
),
eager AS MATERIALIZED (
    -- `holding`: the status the claim below fences on, as a column (a constant would let the
    -- planner read the whole partial index steps_one_unfinished and hash it)
    SELECT w.*, c.lease, 'waiting'::text AS holding
    FROM woken w
    JOIN unnest(%(lanes)s::text[], %(free)s::int[], %(leases)s::float8[]) AS c(lane, free, lease)
      ON c.lane = w.lane AND w.nth <= c.free
),
to_ready AS (
    SELECT w.org_id, w.run_id, w.seq, 'waiting' AS from_status, NULL::int AS attempt,
           now() AS available_at, w.wake, NULL::jsonb AS error, 'timer_fired' AS event,
           NULL::text AS worker, w.detail
    FROM woken w
    WHERE NOT EXISTS (SELECT 1 FROM eager e WHERE e.org_id = w.org_id AND e.timer_id = w.timer_id)
),
{{make_ready}},
claimed AS (
    -- the eager ones: claimed from 'waiting' by the firing worker (re-checked under the row
    -- lock, as make_ready does: a step that stopped waiting meanwhile is left alone)
    UPDATE steps st
    SET status = 'running', attempt = st.attempt + 1, owner = %(worker)s,
        lease_until = now() + make_interval(secs => e.lease), claimed_at = now(),
        wait_kind = NULL, available_at = now(), wake = e.wake, updated_at = now()
    FROM eager e
    WHERE st.org_id = e.org_id AND st.run_id = e.run_id AND st.seq = e.seq
      AND st.status = e.holding
    RETURNING st.org_id, st.run_id, st.seq, st.step_id, st.kind, st.lane, st.iteration,
              st.attempt, st.failures, st.wake, st.version AS step_version,
              0.0::float8 AS queue_lag_s, e.timer_id, e.detail, e.holding AS from_status
),
claimed_history AS (
    INSERT INTO history_log (org_id, run_id, event, seq, step_id, attempt, worker, detail)
    SELECT org_id, run_id, 'timer_fired', seq, step_id, nullif(attempt - 1, 0), NULL, detail
    FROM claimed
),
run AS (
    UPDATE runs r SET status = 'active', updated_at = now()
    FROM (SELECT org_id, run_id, from_status FROM ready
          UNION ALL SELECT org_id, run_id, from_status FROM claimed) w
    WHERE r.org_id = w.org_id AND r.run_id = w.run_id AND r.status = w.from_status
)
-- one row per fired timer; an eager one carries its claim as leases.sql claim returns it (the
-- run as of the statement's snapshot: its status is all this statement changes)
SELECT f.org_id, f.timer_id, f.run_id,
       extract(epoch FROM f.fired_at - f.due_at)::float8 AS lateness_s,
       coalesce(ready.lane, c.lane) AS lane, c.attempt IS NOT NULL AS claimed,
       c.seq, c.step_id, c.kind, c.iteration, c.attempt, c.failures, c.wake, c.queue_lag_s,
       now() AS db_now, r.automation_id, coalesce(c.step_version, r.version) AS version,
       r.input, r.ctx, r.visits, r.traceparent, r.steps_executed, r.max_steps,
       r.cancel_requested_at IS NOT NULL AS cancel_requested,
       r.steps_executed >= r.max_steps AS over_steps, now() > r.deadline_at AS over_age
FROM f
LEFT JOIN ready ON ready.org_id = f.org_id AND ready.run_id = f.run_id AND ready.seq = f.seq
LEFT JOIN claimed c ON c.org_id = f.org_id AND c.timer_id = f.timer_id
LEFT JOIN runs r ON c.attempt IS NOT NULL AND r.org_id = f.org_id AND r.run_id = f.run_id;

-- name: pending_calendar
-- A page of one organisation's pending calendar timers (their intent holds a rule), keyset on
-- timer_id, narrowed to a run, a contact, or an automation (and step) when given.
SELECT t.org_id, t.timer_id, t.run_id, t.seq, t.due_at, t.wake_n, t.intent
FROM timers t
JOIN runs r ON r.org_id = t.org_id AND r.run_id = t.run_id
JOIN steps s ON s.org_id = t.org_id AND s.run_id = t.run_id AND s.seq = t.seq
WHERE t.org_id = (SELECT %(org_id)s::text) AND t.fired_at IS NULL AND t.intent ? 'rule'
  AND t.timer_id > %(after)s
  AND (%(run_id)s::text IS NULL OR t.run_id = %(run_id)s)
  AND (%(contact_id)s::text IS NULL OR r.contact_id = %(contact_id)s)
  AND (%(automation_id)s::text IS NULL OR r.automation_id = %(automation_id)s)
  AND (%(step_id)s::text IS NULL OR s.step_id = %(step_id)s)
ORDER BY t.timer_id
LIMIT %(limit)s;

-- name: pending_calendar_all
-- A page of every organisation's pending calendar timers, keyset on (org_id, timer_id): what a
-- tz database update recomputes. Served by the partial index timers_calendar_pending.
SELECT org_id, timer_id, run_id, seq, due_at, wake_n, intent
FROM timers
WHERE fired_at IS NULL AND intent ? 'rule'
  AND (org_id, timer_id) > (%(after_org)s, %(after)s)
ORDER BY org_id, timer_id
LIMIT %(limit)s;

-- name: move
-- Recompute: each timer still unfired and still at the wake number that was read gets its
-- new instant and intent and the next wake number -- the wake already sent for the old one
-- then fires nothing -- with a delayed wake for the new instant and a history row holding
-- both instants. A timer fired or moved meanwhile is left alone (0 rows for it).
WITH x AS MATERIALIZED (
    -- `unfired` is the fence's NULL as a column of this materialised batch: a literal
    -- `fired_at IS NULL` would let the planner read the whole partial index timers_due (every
    -- pending timer, a million on a Monday) and hash it against the batch when its statistics
    -- call that index nearly empty; this leaves one lookup by timers_pkey a timer
    -- (tests/integration/test_batch_plans.py)
    SELECT x.*, NULL::timestamptz AS unfired
    FROM unnest(%(org_ids)s::text[], %(timer_ids)s::bigint[], %(wake_ns)s::int[],
                %(old_dues)s::timestamptz[], %(new_dues)s::timestamptz[], %(intents)s::jsonb[])
        AS x(org_id, timer_id, wake_n, old_due, new_due, intent)
),
m AS (
    UPDATE timers t SET due_at = x.new_due, intent = x.intent, wake_n = t.wake_n + 1
    FROM x
    WHERE t.org_id = x.org_id AND t.timer_id = x.timer_id
      AND t.fired_at IS NOT DISTINCT FROM x.unfired
      AND t.wake_n = x.wake_n
    RETURNING t.org_id, t.timer_id, t.run_id, t.seq, t.wake_n, t.due_at, x.old_due
),
timer_due AS (
    SELECT m.org_id, m.timer_id, m.run_id, m.seq, m.wake_n, m.due_at, st.lane, st.step_id,
           m.old_due
    FROM m JOIN steps st ON st.org_id = m.org_id AND st.run_id = m.run_id AND st.seq = m.seq
),
{{announce_timer}},
hist AS (
    INSERT INTO history_log (org_id, run_id, event, seq, step_id, worker, detail)
    SELECT org_id, run_id, 'timer_moved', seq, step_id, %(worker)s,
           jsonb_build_object('timer_id', timer_id, 'from', old_due, 'to', due_at,
                              'wake_n', wake_n, 'reason', %(reason)s::text)
    FROM timer_due
)
SELECT org_id, timer_id, due_at, wake_n FROM timer_due;

-- name: pending_of_run
-- The unfired timer a waiting step of the run waits on (the wait itself or its deadline).
-- "Unfired" is `fired_at IS NOT DISTINCT FROM (SELECT NULL::timestamptz)`, a value the planner
-- does not see, here and in the two below: a literal `fired_at IS NULL` would let it read the
-- organisation's every pending timer through the partial index timers_due, filtering on the
-- run, whenever its statistics call that index nearly empty, instead of the run's own timers
-- by timers_by_step (tests/integration/test_batch_plans.py).
SELECT t.org_id, t.timer_id, t.run_id, t.seq, t.due_at, t.wake_n, t.intent, t.purpose,
       now() AS db_now
FROM timers t
JOIN steps s ON s.org_id = t.org_id AND s.run_id = t.run_id AND s.seq = t.seq
WHERE t.org_id = (SELECT %(org_id)s::text) AND t.run_id = %(run_id)s
  AND t.fired_at IS NOT DISTINCT FROM (SELECT NULL::timestamptz)
  AND s.status = 'waiting'
ORDER BY t.timer_id;

-- name: db_now
-- The database's clock: the reference instant of a preview that names none.
SELECT now() AS now;

-- name: lock_pending_of_run
-- Lock a run's unfired timers before its step (the order a fire takes them: timer, then step),
-- so closing them with the step cannot deadlock with a fire.
SELECT timer_id FROM timers
WHERE org_id = (SELECT %(org_id)s::text) AND run_id = %(run_id)s
  AND fired_at IS NOT DISTINCT FROM (SELECT NULL::timestamptz)
ORDER BY timer_id
FOR UPDATE;

-- name: close_for_run
-- The run ended while its timers were pending (cancelled): they fire nothing, now or later.
UPDATE timers SET fired_at = now(), fired_by = %(fired_by)s
WHERE org_id = (SELECT %(org_id)s::text) AND run_id = %(run_id)s
  AND fired_at IS NOT DISTINCT FROM (SELECT NULL::timestamptz);
