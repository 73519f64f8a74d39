-- Statement fragments shared by the transitions of several modules, included into their named
-- queries with {{name}} (db/sql.py). Each is the one source of its write: a transition that
-- makes a step ready writes the step row, its outbox wake and its history row only through
-- these, so the wake id format, the wake's lane and the history row cannot drift apart.

-- fragment: make_ready
-- Expects a CTE `to_ready` (org_id, run_id, seq, from_status, attempt, available_at, wake,
-- error, event, worker, detail). Each named step still in from_status -- and, where attempt is
-- not NULL, still at that attempt: the fence -- becomes ready at available_at, owned by nobody;
-- a lease it holds ends now (a lapsed one keeps the instant it lapsed); `wake` (what woke it) and
-- `error` replace the step's own when given. A failed attempt -- the events `step_retry` (an
-- error) and `lease_expired` (its worker died or stalled) -- counts in `failures`, what retry
-- policies count; a deferral, a release, a wake or a resume does not. A step made ready from
-- 'running' ends that attempt: its history row carries when the attempt was claimed. Then
-- announce_ready. `ready` returns each step's from_status too: a run that mirrors it (a
-- waiting or parked run resuming) fences on `runs.status = ready.from_status`, a column, so
-- its update looks each run up by key -- a constant would let the planner read the whole
-- partial index runs_waiting_deadline and hash it.
ready AS (
    UPDATE steps st
    SET status = 'ready', owner = NULL,
        lease_until = CASE WHEN st.lease_until IS NOT NULL THEN least(st.lease_until, now()) END,
        wait_kind = NULL,
        available_at = r.available_at, wake = coalesce(r.wake, st.wake),
        error = coalesce(r.error, st.error), updated_at = now(),
        failures = st.failures + CASE WHEN r.event IN ('step_retry', 'lease_expired')
                                      THEN 1 ELSE 0 END
    -- OFFSET 0 keeps to_ready a subquery of its own: pulled up, its constant from_status
    -- would let the planner read a whole partial index that status implies
    -- (steps_one_unfinished, steps_leased) and hash it against the batch, instead of one
    -- lookup by steps_pkey a step (tests/integration/test_batch_plans.py)
    FROM (SELECT * FROM to_ready OFFSET 0) r
    WHERE st.org_id = r.org_id AND st.run_id = r.run_id AND st.seq = r.seq
      AND st.status = r.from_status AND (r.attempt IS NULL OR st.attempt = r.attempt)
    RETURNING st.org_id, st.run_id, st.seq, st.step_id, st.lane, st.attempt,
              st.available_at AS deliver_at, r.event, r.worker, r.detail,
              CASE WHEN r.from_status = 'running' THEN st.claimed_at END AS claimed_at,
              r.from_status
),
{{announce_ready}}

-- fragment: announce_ready
-- Expects a CTE `ready` (org_id, run_id, seq, step_id, lane, attempt, deliver_at, event,
-- worker, detail, claimed_at): steps that are ready now; claimed_at: when the attempt this
-- makes ready ended was claimed (NULL: it ends none). Writes, in the same statement, the outbox row
-- that wakes a worker of the step's lane at deliver_at -- its job id names the attempt it
-- invites (attempt + 1, onward_step_wake_id) -- and the history row of the transition.
ready_wake AS (
    INSERT INTO outbox (org_id, topic, job_id, lane, payload, deliver_at)
    SELECT org_id, 'step', onward_step_wake_id(run_id, seq, attempt + 1), lane,
           jsonb_build_object('run_id', run_id, 'seq', seq), deliver_at
    FROM ready
),
ready_history AS (
    INSERT INTO history_log (org_id, run_id, event, seq, step_id, attempt, worker, claimed_at,
                         detail)
    SELECT org_id, run_id, event, seq, step_id, nullif(attempt, 0), worker, claimed_at, detail
    FROM ready
)

-- fragment: fold_ready
-- Expects `ready` from make_ready. A step made ready from 'running' (a retry, a deferral, a
-- release, a rescue) may have been entered by a settle that left its run's row behind
-- (migration 0030, leases.sql settle_advance): the run's row catches up to it here, in the same
-- statement, so whoever claims the step next reads a current run. A row already current
-- (current_seq is the step's) is not written.
ready_fold AS (
    UPDATE runs r
    SET (ctx, visits, steps_executed, current_seq) = (
            SELECT f.ctx, f.visits, f.steps_executed, f.current_seq
            FROM onward_fold(r, ready.seq) AS f),
        updated_at = now()
    FROM ready
    WHERE ready.from_status = 'running' AND r.org_id = ready.org_id AND r.run_id = ready.run_id
      AND r.current_seq < ready.seq
)

-- fragment: announce_timer
-- Expects a CTE `timer_due` (org_id, timer_id, run_id, seq, wake_n, due_at, lane): timers
-- that are now due at due_at under wake number wake_n. Writes the delayed outbox row that
-- wakes a worker of the step's lane at that instant (the fast path; job id
-- onward_timer_wake_id, payload with wake_n so a wake of an older wake number fires nothing),
-- and flags the organisation for the due sweep (the backstop).
timer_wake AS (
    INSERT INTO outbox (org_id, topic, job_id, lane, payload, deliver_at)
    SELECT org_id, 'timer', onward_timer_wake_id(org_id, timer_id, wake_n), lane,
           jsonb_build_object('timer_id', timer_id, 'run_id', run_id, 'seq', seq,
                              'wake_n', wake_n),
           due_at
    FROM timer_due
),
timer_org AS (
    UPDATE organisations o SET has_due_work = true
    WHERE o.org_id IN (SELECT org_id FROM timer_due) AND NOT o.has_due_work
)

-- fragment: notify
-- Expects a CTE `to_notify` (org_id, kind, subject, body). Writes each notification and, in the
-- same statement, its delivery intent to every destination its organisation has now (R15):
-- the transition that tells the customer something and the promise to deliver it commit
-- together. A notification written while its organisation has no destination waits, undelivered,
-- for the first destination set (`notify.sql set_destination` adds its intents then).
noted AS (
    INSERT INTO notifications (org_id, kind, subject, body)
    SELECT org_id, kind, subject, body FROM to_notify
    RETURNING org_id, notification_id, kind, subject
),
intents AS (
    INSERT INTO notification_deliveries (org_id, notification_id, destination_id)
    SELECT n.org_id, n.notification_id, d.destination_id
    FROM noted n JOIN notification_destinations d ON d.org_id = n.org_id
    RETURNING org_id, notification_id
)
