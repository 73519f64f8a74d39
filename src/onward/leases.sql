-- Step claims, heartbeats and fenced settles (R3). The claim increments attempt: that number
-- is the worker's fencing token, and every later write of the step names it, so a worker whose
-- lease was taken over writes nothing (0 rows). Every comparison uses the database's now().
-- A statement that names its step (org_id, run_id, seq) fences on `status = (SELECT
-- 'running'::text)`, a value the planner does not see: a literal lets it read the whole of
-- steps_leased, whose predicate it implies (every running step: thousands under load),
-- whenever its statistics call that index nearly empty, instead of the step by steps_pkey.
-- Before migration 0034 the literal led it to steps_one_unfinished, by the run, instead
-- (tests/integration/test_batch_plans.py). The batched statements fence on a column
-- (`holding`) for the same reason.

-- name: claim
-- Claim up to %(limit)s ready steps of one lane. SKIP LOCKED: concurrent claimers never wait
-- on or take the same row. Returns what the worker needs to run each step in one round trip.
-- No history row: the claim lives on the step row (owner, attempt, claimed_at) until the row
-- that ends the attempt records it (a settle, or lease_expired / step_released).
WITH picked AS (
    SELECT org_id, run_id, seq FROM steps
    WHERE status = 'ready' AND lane = %(lane)s AND available_at <= now()
    ORDER BY available_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
),
claimed AS (
    UPDATE steps s
    SET status = 'running', attempt = s.attempt + 1, owner = %(worker)s,
        lease_until = now() + make_interval(secs => %(lease)s), claimed_at = now(),
        updated_at = now()
    FROM picked p
    WHERE s.org_id = p.org_id AND s.run_id = p.run_id AND s.seq = p.seq
    RETURNING s.org_id, s.run_id, s.seq, s.step_id, s.kind, s.lane, s.iteration, s.attempt,
              s.failures, s.wake, s.version AS step_version,
              extract(epoch FROM now() - s.available_at)::float8 AS queue_lag_s
)
-- the version of the step's definition: the step row's own when a migration moved it (the
-- locked row is current; this join reads the run as of the statement's snapshot)
SELECT c.*, now() AS db_now, r.automation_id, coalesce(c.step_version, r.version) AS version,
       r.input, r.ctx, r.visits, r.traceparent,
       r.steps_executed,
       r.max_steps, r.cancel_requested_at IS NOT NULL AS cancel_requested,
       r.steps_executed >= r.max_steps AS over_steps, now() > r.deadline_at AS over_age
FROM claimed c JOIN runs r ON r.org_id = c.org_id AND r.run_id = c.run_id;

-- name: hold
-- Whether this attempt still holds its step, with the step row locked (FOR SHARE) until the
-- caller's transaction ends: no rescue or takeover moves the step on meanwhile, so what that
-- transaction writes is written by the step's current holder or not at all (a budget
-- reservation: budgets.reserve).
SELECT true AS held FROM steps
WHERE org_id = (SELECT %(org_id)s::text) AND run_id = %(run_id)s AND seq = %(seq)s
  AND attempt = %(attempt)s AND status = (SELECT 'running'::text)
FOR SHARE;

-- name: heartbeat
-- Extend the leases this worker still holds (each by its lane's lease), all in one statement. A step missing from the
-- result was taken over (its attempt moved on) or finished: its task must stop at once.
-- The fence's status is a column of the materialised batch (`holding`), as in settle_advance:
-- a constant would let the planner read a whole partial index it implies and hash it.
-- The heartbeat never waits for a row lock (SKIP LOCKED): a step another transaction has
-- locked this instant -- this worker's own grouped settle committing it, its budget
-- reservation (`hold`), a migration's or a cancel's batch -- keeps its lease until the next
-- beat and is reported held, as the statement's snapshot shows it. Waiting there let a
-- heartbeat, a settle and a migration (which lock steps in orders a hash join does not keep)
-- wait on each other in a cycle: deadlocks in chaos runs of 2026-12-06 and 2026-12-07,
-- resolved by retries; a heartbeat that waits on nobody is in no cycle. A step taken over in
-- the instant between the snapshot and the lock is reported held once more: the next beat
-- drops it, and every write of its attempt is fenced anyway.
WITH h AS MATERIALIZED (
    SELECT h.org_id, h.run_id, h.seq, h.attempt, h.lease, 'running'::text AS holding
    FROM unnest(%(org_ids)s::text[], %(run_ids)s::text[], %(seqs)s::int[],
                %(attempts)s::int[], %(leases)s::float8[])
         AS h(org_id, run_id, seq, attempt, lease)
    ORDER BY h.org_id, h.run_id, h.seq
),
free AS (
    SELECT s.org_id, s.run_id, s.seq, h.lease
    FROM h JOIN steps s
      ON s.org_id = h.org_id AND s.run_id = h.run_id AND s.seq = h.seq
     AND s.attempt = h.attempt AND s.status = h.holding
    FOR UPDATE OF s SKIP LOCKED
),
extended AS (
    UPDATE steps s
    SET lease_until = now() + make_interval(secs => f.lease)
    FROM free f
    WHERE s.org_id = f.org_id AND s.run_id = f.run_id AND s.seq = f.seq
    RETURNING s.org_id, s.run_id, s.seq
)
SELECT org_id, run_id, seq FROM extended
UNION
SELECT s.org_id, s.run_id, s.seq
FROM h JOIN steps s
  ON s.org_id = h.org_id AND s.run_id = h.run_id AND s.seq = h.seq
 AND s.attempt = h.attempt AND s.status = h.holding;

-- name: settle_advance
-- Steps are done: record each output and the variables it set (and the settle's history
-- event, on the step row: migration 0029), and either enter the next step or complete the
-- run. The run's row is written when the run completes, when the next step is not entered
-- here, when the automation reads the step's output (keep) or when the run was not active;
-- otherwise it is left behind (migration 0030) and the worker carries the run on in memory.
-- Set-based: a worker groups the settles of its concurrent chains (independent runs) into
-- one statement and one commit; each row keeps its own fence (attempt = token AND status =
-- 'running'), so a stale row is skipped while the others settle. When eager, the next step
-- is inserted already claimed by this worker (attempt 1, the lease of its lane), so no
-- wake-up is needed; otherwise it is inserted ready with an outbox row for its lane.
WITH x AS MATERIALIZED (
    -- the batch arrives as one JSON array of objects: one parameter that orjson writes in C
    -- (fifteen parallel arrays cost the worker about 35 us a step in psycopg's Python array
    -- dumper). A JSON null, or a missing key, reads as SQL NULL; an output of None stays the
    -- JSON null it always was. `holding` is the fence's status, 'running', as a column of this
    -- materialised batch rather than a constant in `done`: a constant would let the planner
    -- read a whole partial index the fence implies (steps_leased: every running step) and
    -- hash it (its estimate of that index is a handful of rows; under load it is thousands,
    -- a scan of them all for every settle); a column leaves it one lookup by steps_pkey a
    -- step (tests/integration/test_batch_plans.py).
    -- `same`: the step's output is its variables (one dict, as `set` returns), sent once as
    -- `vars` and stored once: `output` (what the step row stores) is NULL, which on a settled
    -- step reads as its `vars` (onward_step_output, migration 0032)
    SELECT x.org_id, x.run_id, x.seq, x.attempt,
           CASE WHEN x.same AND x.vars <> '{}' THEN NULL ELSE coalesce(x.output, 'null') END
               AS output,
           coalesce(x.vars, '{}'::jsonb) AS vars, x.next_step_id, x.next_kind, x.next_lane,
           x.next_iteration, x.eager, x.done_status, x.detail, x.lease, x.keep,
           'running'::text AS holding
    FROM jsonb_to_recordset(%(items)s::jsonb) AS x(
        org_id text, run_id text, seq int, attempt int, output jsonb, vars jsonb,
        next_step_id text, next_kind text, next_lane text, next_iteration int, eager bool,
        done_status text, detail jsonb, lease float8, keep bool, same bool)
    -- locked in key order (its steps, then its runs), as the heartbeat's batch is
    ORDER BY x.org_id, x.run_id, x.seq
),
done AS (
    -- the step row is the record of its settle (migration 0029): the event's id from the
    -- history's sequence, its detail (the skipped steps; the run's completion rides on its
    -- last step), and the worker as the row's owner; the view `history` shows it as the
    -- step_done (or step_skipped) event, and no history row is written
    UPDATE steps s
    SET status = x.done_status, output = x.output, vars = nullif(x.vars, '{}'::jsonb),
        owner = %(worker)s, lease_until = NULL, finished_at = now(), updated_at = now(),
        event_id = nextval('history_event_id_seq'),
        event_detail = CASE WHEN x.next_step_id IS NULL
                            THEN coalesce(x.detail, '{}'::jsonb) || '{"run": "completed"}'::jsonb
                            ELSE x.detail END
    FROM x
    WHERE s.org_id = x.org_id AND s.run_id = x.run_id AND s.seq = x.seq
      AND s.attempt = x.attempt AND s.status = x.holding
    RETURNING s.org_id, s.run_id, s.seq, s.step_id
),
dx AS (
    SELECT x.*, d.step_id FROM done d
    JOIN x ON x.org_id = d.org_id AND x.run_id = d.run_id AND x.seq = d.seq
),
was AS MATERIALIZED (
    -- each settled step's run as this statement's snapshot has it, and whether this settle
    -- writes its row: not when it enters the next step here (eager), keeps no output for the
    -- run and the run stays active -- the run's row is then left behind (migration 0030:
    -- its steps carry the variables and visits since; onward_fold catches it up) and the
    -- worker carries the run on in memory. Decided once, here: the update below writes only
    -- the rows this marks, whatever a concurrent transition did to the row meanwhile.
    SELECT dx.*, r.current_seq, r.steps_executed, r.max_steps, r.deadline_at,
           r.cancel_requested_at,
           (dx.next_step_id IS NULL OR NOT dx.eager OR dx.keep OR r.status <> 'active') AS writes
    FROM dx JOIN runs r ON r.org_id = dx.org_id AND r.run_id = dx.run_id
),
run AS (
    UPDATE runs r
    -- caught up to this step (the steps since current_seq folded in), then this step's own:
    -- the variables it set, its output only when some expression of the automation reads it
    -- (keep; it is on the step row anyway), the next step's visit, the count, the position
    SET (ctx, visits, steps_executed, current_seq) = (
            SELECT CASE WHEN w.keep
                        THEN jsonb_set(c.ctx, ARRAY['steps', w.step_id], coalesce(w.output, w.vars))
                        ELSE c.ctx END,
                   CASE WHEN w.next_step_id IS NULL THEN f.visits
                        ELSE jsonb_set(f.visits, ARRAY[w.next_step_id], to_jsonb(w.next_iteration))
                   END,
                   f.steps_executed + 1,
                   CASE WHEN w.next_step_id IS NULL THEN w.seq ELSE w.seq + 1 END
            FROM onward_fold(r, w.seq) AS f,
                 LATERAL (SELECT CASE WHEN w.vars = '{}' THEN f.ctx
                                      ELSE jsonb_set(f.ctx, '{vars}',
                                                     coalesce(f.ctx -> 'vars', '{}') || w.vars)
                                 END AS ctx) AS c),
        status = CASE WHEN w.next_step_id IS NULL THEN 'completed' ELSE 'active' END,
        finished_at = CASE WHEN w.next_step_id IS NULL THEN now() END,
        updated_at = now()
    FROM was w
    WHERE w.writes AND r.org_id = w.org_id AND r.run_id = w.run_id
    RETURNING r.org_id, r.run_id, r.status, r.steps_executed, r.max_steps, now() AS db_now,
              now() > r.deadline_at AS over_age,
              r.cancel_requested_at IS NOT NULL AS cancel_requested
),
behind AS (
    -- what the worker needs of a run whose row this settle leaves alone, in run's columns
    -- (the union below takes their names from it): its count as the row would have it caught
    -- up (each step since current_seq, this one too)
    SELECT w.org_id, w.run_id, 'active', w.steps_executed + w.seq - w.current_seq + 1,
           w.max_steps, now(), now() > w.deadline_at, w.cancel_requested_at IS NOT NULL
    FROM was w WHERE NOT w.writes
),
next AS (
    INSERT INTO steps (org_id, run_id, seq, step_id, kind, lane, iteration, status, attempt,
                       owner, lease_until, claimed_at)
    SELECT dx.org_id, dx.run_id, dx.seq + 1, dx.next_step_id, dx.next_kind, dx.next_lane,
           dx.next_iteration,
           CASE WHEN dx.eager THEN 'running' ELSE 'ready' END,
           CASE WHEN dx.eager THEN 1 ELSE 0 END,
           CASE WHEN dx.eager THEN %(worker)s END,
           CASE WHEN dx.eager THEN now() + make_interval(secs => dx.lease) END,
           CASE WHEN dx.eager THEN now() END
    FROM dx
    WHERE dx.next_step_id IS NOT NULL
    RETURNING org_id, run_id, seq, step_id, lane, attempt, available_at, status
),
ready AS (
    SELECT n.org_id, n.run_id, n.seq, n.step_id, n.lane, n.attempt, n.available_at AS deliver_at,
           'step_ready' AS event, %(worker)s::text AS worker,
           jsonb_build_object('lane', n.lane, 'iteration', dx.next_iteration) AS detail,
           NULL::timestamptz AS claimed_at
    FROM next n
    JOIN dx ON dx.org_id = n.org_id AND dx.run_id = n.run_id
    -- after its predecessor's event: the announce's history row draws its id after the one
    -- `done` drew (this reads `next`, which reads `done`)
    WHERE n.status = 'ready'
),
{{announce_ready}}
SELECT * FROM run
UNION ALL
SELECT * FROM behind;

-- name: settle_wait_timer
-- The step waits: on time (wait_kind 'timer', the timer is the wait), or on signals or a
-- person ('signal' / 'approval', the timer is the wait's deadline). The step and run become
-- waiting, a timer row stores the intent and the computed UTC instant (due_at, by the
-- database clock), and a delayed outbox row carries the fast-path wake for that instant. The
-- due sweep is the backstop if the wake is lost (R7). A signal wait names the signals it
-- takes (steps.signals); the settler then consumes one already pending (signals.consume).
WITH w AS (
    UPDATE steps
    SET status = 'waiting', wait_kind = %(wait_kind)s, signals = %(signals)s::text[],
        owner = NULL, lease_until = NULL, wake = NULL, updated_at = now()
    WHERE org_id = (SELECT %(org_id)s::text) AND run_id = %(run_id)s AND seq = %(seq)s
      AND attempt = %(attempt)s AND status = (SELECT 'running'::text)
    RETURNING org_id, run_id, seq, step_id, lane, claimed_at
),
t AS (
    INSERT INTO timers (org_id, run_id, seq, purpose, intent, due_at)
    SELECT org_id, run_id, seq, CASE WHEN %(wait_kind)s = 'timer' THEN 'wait' ELSE 'deadline' END,
           %(intent)s, coalesce(%(due_at)s::timestamptz, now() + make_interval(secs => %(due_in)s))
    FROM w
    RETURNING org_id, timer_id, run_id, seq, due_at, wake_n
),
run AS (
    -- caught up to the waiting step (migration 0030: it may have been entered by a settle
    -- that left the run's row behind)
    UPDATE runs r
    SET (ctx, visits, steps_executed, current_seq) = (
        SELECT f.ctx, f.visits, f.steps_executed, f.current_seq FROM onward_fold(r, w.seq) AS f),
        status = 'waiting', updated_at = now()
    FROM w WHERE r.org_id = w.org_id AND r.run_id = w.run_id
),
timer_due AS (
    SELECT t.org_id, t.timer_id, t.run_id, t.seq, t.wake_n, t.due_at, w.lane FROM t JOIN w ON true
),
{{announce_timer}},
hist AS (
    INSERT INTO history_log (org_id, run_id, event, seq, step_id, attempt, worker, claimed_at,
                         detail)
    SELECT w.org_id, w.run_id, 'step_waiting', w.seq, w.step_id, %(attempt)s, %(worker)s,
           w.claimed_at,
           jsonb_build_object('on', %(wait_kind)s::text, 'timer_id', t.timer_id,
                              'due_at', t.due_at, 'intent', %(intent)s::jsonb)
    FROM w JOIN t ON true
)
SELECT timer_id, due_at FROM t;

-- name: settle_retry
-- A retryable failure: the step becomes ready again after the backoff, with a delayed wake
-- whose job id names the next attempt. A provider's HTTP-date Retry-After arrives as
-- %(retry_at)s and is compared with the database's clock, never the worker's.
WITH to_ready AS (
    SELECT %(org_id)s::text AS org_id, %(run_id)s::text AS run_id, %(seq)s::int AS seq,
           'running' AS from_status, %(attempt)s::int AS attempt, at.available_at,
           NULL::jsonb AS wake, %(error)s::jsonb AS error, 'step_retry' AS event,
           %(worker)s::text AS worker,
           jsonb_build_object('error', %(error)s::jsonb,
                              'delay_s', extract(epoch FROM at.available_at - now())::float8,
                              'retry_at', at.available_at) AS detail
    FROM (SELECT greatest(now() + make_interval(secs => %(delay)s),
                          coalesce(%(retry_at)s::timestamptz, '-infinity')) AS available_at) at
),
{{make_ready}},
{{fold_ready}}
SELECT deliver_at AS available_at FROM ready;

-- name: settle_defer
-- A limit (a concurrency cap, a rate) held the step's outside call back before it was made:
-- the step is ready again at now + %(delay)s with a wake for that instant, and no attempt is
-- spent (failures unchanged; the claim's attempt stays the fence). The step never waited for
-- the limit while holding its lease.
WITH to_ready AS (
    SELECT %(org_id)s::text AS org_id, %(run_id)s::text AS run_id, %(seq)s::int AS seq,
           'running' AS from_status, %(attempt)s::int AS attempt,
           now() + make_interval(secs => %(delay)s) AS available_at, NULL::jsonb AS wake,
           NULL::jsonb AS error, 'step_deferred' AS event, %(worker)s::text AS worker,
           %(detail)s::jsonb AS detail
),
{{make_ready}},
{{fold_ready}}
SELECT deliver_at AS available_at FROM ready;

-- name: settle_stop
-- The step ends without a successor and so does the run: failed (a permanent error or its
-- attempts ran out), exceeded (over budget, R13) or cancelled. Or the step parks for a person
-- (review, reconnect) and the run with it. %(step_status)s / %(run_status)s say which.
WITH s AS (
    UPDATE steps
    SET status = %(step_status)s, owner = NULL, lease_until = NULL, error = %(error)s,
        wait_kind = %(wait_kind)s, updated_at = now(),
        finished_at = CASE WHEN %(step_status)s IN ('failed', 'cancelled', 'skipped') THEN now() END
    WHERE org_id = (SELECT %(org_id)s::text) AND run_id = %(run_id)s AND seq = %(seq)s
      AND attempt = %(attempt)s AND status = (SELECT 'running'::text)
    RETURNING org_id, run_id, seq, step_id, claimed_at
),
run AS (
    -- caught up to the step (migration 0030), then stopped or parked with it
    UPDATE runs r
    SET (ctx, visits, steps_executed, current_seq) = (
        SELECT f.ctx, f.visits, f.steps_executed, f.current_seq FROM onward_fold(r, s.seq) AS f),
        status = %(run_status)s, status_reason = %(reason)s, updated_at = now(),
        finished_at = CASE WHEN %(run_status)s IN ('failed', 'exceeded', 'cancelled', 'completed')
                           THEN now() END
    FROM s WHERE r.org_id = s.org_id AND r.run_id = s.run_id
),
hist AS (
    INSERT INTO history_log (org_id, run_id, event, seq, step_id, attempt, worker, claimed_at,
                         detail)
    SELECT org_id, run_id, e.event, e.seq, e.step_id, %(attempt)s, %(worker)s, e.claimed_at,
           e.detail
    FROM s CROSS JOIN LATERAL (VALUES
        ('step_' || %(step_status)s::text, s.seq, s.step_id, s.claimed_at, %(error)s::jsonb),
        ('run_' || %(run_status)s::text, NULL::int, NULL::text, NULL::timestamptz,
         jsonb_build_object('reason', %(reason)s::text))
    ) AS e(event, seq, step_id, claimed_at, detail)
)
SELECT count(*) AS settled FROM s;

-- name: settle_cancel_requested
-- A cancel was requested while the step ran (R12) and the step would now wait, retry, be
-- deferred or park: it ends cancelled instead, and its run with it. Runs in the settler's
-- transaction after the run's transition lock (signals.lock_run), which a cancel takes too, so
-- this statement's snapshot sees any cancel committed before: none can slip between this check
-- and the settle that follows it (0 rows here: the settle goes ahead).
WITH s AS (
    UPDATE steps st
    SET status = 'cancelled', owner = NULL, lease_until = NULL, finished_at = now(),
        updated_at = now()
    FROM runs r
    WHERE st.org_id = (SELECT %(org_id)s::text) AND st.run_id = %(run_id)s AND st.seq = %(seq)s
      AND st.attempt = %(attempt)s AND st.status = (SELECT 'running'::text)
      AND r.org_id = st.org_id AND r.run_id = st.run_id
      AND r.cancel_requested_at IS NOT NULL AND r.finished_at IS NULL
    RETURNING st.org_id, st.run_id, st.seq, st.step_id, st.claimed_at
),
run AS (
    -- caught up to the step (migration 0030), then cancelled
    UPDATE runs r
    SET (ctx, visits, steps_executed, current_seq) = (
        SELECT f.ctx, f.visits, f.steps_executed, f.current_seq FROM onward_fold(r, s.seq) AS f),
        status = 'cancelled', status_reason = 'cancelled on request', finished_at = now(),
        updated_at = now()
    FROM s WHERE r.org_id = s.org_id AND r.run_id = s.run_id
),
hist AS (
    INSERT INTO history_log (org_id, run_id, event, seq, step_id, attempt, worker, claimed_at,
                         detail)
    SELECT org_id, run_id, e.event, e.seq, e.step_id, %(attempt)s, %(worker)s, e.claimed_at,
           e.detail
    FROM s CROSS JOIN LATERAL (VALUES
        ('step_cancelled', s.seq, s.step_id, s.claimed_at,
         jsonb_build_object('instead_of', %(instead_of)s::text)),
        ('run_cancelled', NULL::int, NULL::text, NULL::timestamptz,
         jsonb_build_object('reason', 'cancelled on request', 'at', 'settle'))
    ) AS e(event, seq, step_id, claimed_at, detail)
)
SELECT count(*) AS cancelled FROM s;

-- name: release
-- Graceful shutdown: hand unfinished steps back at once instead of making another worker wait
-- out the lease. The attempt is kept; the next claim increments it.
WITH to_ready AS (
    SELECT h.org_id, h.run_id, h.seq, 'running' AS from_status, h.attempt,
           now() AS available_at, NULL::jsonb AS wake, NULL::jsonb AS error,
           'step_released' AS event, %(worker)s::text AS worker, NULL::jsonb AS detail
    FROM unnest(%(org_ids)s::text[], %(run_ids)s::text[], %(seqs)s::int[], %(attempts)s::int[])
         AS h(org_id, run_id, seq, attempt)
),
{{make_ready}},
{{fold_ready}}
SELECT run_id, seq FROM ready;

-- name: rescue_expired
-- Steps whose lease ran out (their worker died or stalled) become ready again, with a wake.
-- Run by the elected sweeper, bounded per call. The stale worker's attempt stays fenced; the
-- row names it, its worker (detail.owner; `worker` is the sweeper) and when it was claimed.
WITH to_ready AS (
    SELECT org_id, run_id, seq, 'running' AS from_status, attempt, now() AS available_at,
           NULL::jsonb AS wake, NULL::jsonb AS error, 'lease_expired' AS event,
           %(worker)s::text AS worker,
           jsonb_build_object('lease_until', lease_until, 'owner', owner) AS detail
    FROM steps
    WHERE status = 'running' AND lease_until < now()
    ORDER BY lease_until
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
),
{{make_ready}},
{{fold_ready}}
SELECT count(*) AS rescued FROM ready;
