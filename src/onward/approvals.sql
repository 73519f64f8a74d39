-- Approvals (R10): requests for a decision, the first decision, the permission table, and the
-- secret that signs the buttons' tokens. A decision runs with the run's transition lock held (signals.py
-- lock_run), like a signal: it and the settle that makes the step wait are ordered.
--
-- A statement that names its request (approval_id) fences on statuses as `(SELECT ...)`, values
-- the planner does not see: literal ones let it read a whole partial index they imply --
-- approvals_one_pending, steps_one_unfinished, timers_due: the organisation's every pending
-- request, unfinished step or pending timer -- whenever its statistics call that index nearly
-- empty, instead of the request's own rows by their keys (tests/integration/test_batch_plans.py).

-- name: latest
-- The newest request of a step (its entry seq): what the step's kind acts on when woken.
SELECT approval_id, run_id, seq, step_id, request, digest, content, approvers, channel, nonce,
       status, decided_by, decided_via, decided_at, deadline_at, message_ts, created_at,
       now() >= deadline_at AS past_deadline
FROM approvals
WHERE org_id = (SELECT %(org_id)s::text) AND run_id = %(run_id)s AND seq = %(seq)s
ORDER BY request DESC
LIMIT 1;

-- name: open
-- A new request for the step: a pending one it replaces is superseded first (its buttons then
-- decide nothing), the request number is the next one, and the run's history says who is
-- asked, until when, and the digest of what they are shown. A repeat (same approval id: a
-- retry after a crash) changes nothing and answers the stored row.
WITH old AS (
    UPDATE approvals SET status = 'superseded'
    WHERE org_id = (SELECT %(org_id)s::text) AND run_id = %(run_id)s AND seq = %(seq)s AND status = 'pending'
      AND approval_id <> %(approval_id)s
    RETURNING approval_id
),
ins AS (
    INSERT INTO approvals (org_id, approval_id, run_id, seq, step_id, request, digest, content,
                           approvers, channel, nonce, status, deadline_at)
    VALUES (%(org_id)s, %(approval_id)s, %(run_id)s, %(seq)s, %(step_id)s, %(request)s,
            %(digest)s, %(content)s, %(approvers)s, %(channel)s, %(nonce)s, 'pending',
            now() + make_interval(secs => %(deadline_s)s))
    ON CONFLICT (org_id, approval_id) DO NOTHING
    RETURNING *
),
hist AS (
    INSERT INTO history_log (org_id, run_id, event, seq, step_id, worker, detail)
    SELECT org_id, run_id, 'approval_requested', seq, step_id, %(worker)s,
           jsonb_build_object('approval_id', approval_id, 'request', request, 'digest', digest,
                              'approvers', approvers, 'deadline_at', deadline_at,
                              'superseded', (SELECT array_agg(approval_id) FROM old))
    FROM ins
)
SELECT approval_id, deadline_at, nonce, digest, request FROM ins
UNION ALL
SELECT approval_id, deadline_at, nonce, digest, request FROM approvals
WHERE org_id = (SELECT %(org_id)s::text) AND approval_id = %(approval_id)s
  AND NOT EXISTS (SELECT 1 FROM ins);

-- name: posted
-- The Slack message that asks (its ts), for later updates.
UPDATE approvals SET message_ts = %(message_ts)s
WHERE org_id = (SELECT %(org_id)s::text) AND approval_id = %(approval_id)s;

-- name: get
-- One request, with the automation its run follows and whether its deadline passed.
SELECT a.approval_id, a.run_id, a.seq, a.step_id, a.request, a.digest, a.content, a.approvers,
       a.channel, a.nonce, a.status, a.decided_by, a.decided_via, a.decided_at, a.deadline_at,
       a.message_ts, a.created_at, now() >= a.deadline_at AS past_deadline,
       r.automation_id, r.status AS run_status
FROM approvals a JOIN runs r ON r.org_id = a.org_id AND r.run_id = a.run_id
WHERE a.org_id = (SELECT %(org_id)s::text) AND a.approval_id = %(approval_id)s;

-- name: lock
-- Lock a request for a decision (after the run's transition lock), and the unfired deadline timer of its
-- wait (the timer's intent names the request): a fire holding the timer makes this wait, and
-- then it is fired -- the deadline won; held, no fire can take the step (fire skips locked
-- timers). A request whose step has not begun to wait yet has no timer: it may be decided
-- (the settle that makes the step wait then wakes it, approvals.wake_if_decided).
SELECT a.status, now() >= a.deadline_at AS past_deadline,
       (SELECT t.timer_id FROM timers t
        WHERE t.org_id = a.org_id AND t.run_id = a.run_id AND t.seq = a.seq
          AND t.purpose = 'deadline'
          AND t.fired_at IS NOT DISTINCT FROM (SELECT NULL::timestamptz)
          AND t.intent ->> 'approval_id' = a.approval_id
        ORDER BY t.timer_id DESC LIMIT 1
        FOR UPDATE) AS deadline_timer,
       EXISTS (SELECT 1 FROM timers t
               WHERE t.org_id = a.org_id AND t.run_id = a.run_id AND t.seq = a.seq
                 AND t.purpose = 'deadline' AND t.fired_by IN ('wake', 'sweep')
                 AND t.intent ->> 'approval_id' = a.approval_id) AS deadline_fired
FROM approvals a
WHERE a.org_id = (SELECT %(org_id)s::text) AND a.approval_id = %(approval_id)s
FOR UPDATE OF a;

-- name: permitted
-- Whether this person may decide for this automation now (granted, not revoked).
SELECT EXISTS (
    SELECT 1 FROM approvers
    WHERE org_id = (SELECT %(org_id)s::text) AND approver = %(approver)s AND scope IN (%(automation_id)s, '*')
      AND revoked_at IS NULL
) AS permitted;

-- name: settle
-- Record a decision (approved / rejected), or supersede a request whose content changed, if
-- the request is still pending -- or, with no %(status)s, only act on a request already
-- settled -- and wake the step if it waits on its approval: the step ready (woken by the
-- approval), its deadline timer closed as lost (fired_by 'approval'), the run active, with an
-- outbox wake and a history row, in one statement.
WITH a AS (
    UPDATE approvals
    SET status = %(status)s, decided_by = %(decided_by)s, decided_via = %(via)s,
        decided_at = now()
    WHERE org_id = (SELECT %(org_id)s::text) AND approval_id = %(approval_id)s
      AND status = (SELECT 'pending'::text) AND %(status)s::text IS NOT NULL
    RETURNING org_id, run_id, seq, approval_id, status, decided_by, decided_via, digest
),
target AS (
    SELECT * FROM a
    UNION ALL
    SELECT org_id, run_id, seq, approval_id, status, decided_by, decided_via, digest
    FROM approvals
    WHERE %(status)s::text IS NULL AND org_id = (SELECT %(org_id)s::text) AND approval_id = %(approval_id)s
      AND status IN ('approved', 'rejected', 'superseded')
),
waiting AS (
    SELECT target.* FROM target
    JOIN steps st ON st.org_id = target.org_id AND st.run_id = target.run_id
                 AND st.seq = target.seq
    WHERE st.status = (SELECT 'waiting'::text) AND st.wait_kind = 'approval'
),
deadline AS (
    UPDATE timers t SET fired_at = now(), fired_by = 'approval'
    FROM waiting w
    WHERE t.org_id = w.org_id AND t.run_id = w.run_id AND t.seq = w.seq
      AND t.purpose = 'deadline' AND t.fired_at IS NOT DISTINCT FROM (SELECT NULL::timestamptz)
    RETURNING t.timer_id
),
to_ready AS (
    SELECT w.org_id, w.run_id, w.seq, 'waiting' AS from_status, NULL::int AS attempt,
           now() AS available_at,
           jsonb_build_object('by', 'approval', 'approval_id', w.approval_id,
                              'status', w.status, 'decided_by', w.decided_by) AS wake,
           NULL::jsonb AS error,
           CASE WHEN w.status = 'superseded' THEN 'step_ready' ELSE 'approval_decided' END
               AS event,
           %(worker)s::text AS worker,
           jsonb_build_object('approval_id', w.approval_id, 'status', w.status,
                              'decided_by', w.decided_by, 'via', w.decided_via,
                              'digest', w.digest,
                              'deadline_timer', (SELECT min(timer_id) FROM deadline))
               AS detail
    FROM waiting w
),
{{make_ready}},
run AS (
    UPDATE runs r SET status = 'active', updated_at = now()
    FROM ready
    WHERE r.org_id = ready.org_id AND r.run_id = ready.run_id AND r.status = ready.from_status
)
SELECT (SELECT count(*) FROM a) AS settled, (SELECT count(*) FROM ready) AS woken;

-- name: expire
-- The deadline passed with no decision: the request expires (its buttons then decide nothing)
-- and the run's history says so; the step's kind then applies the deadline's policy.
WITH e AS (
    UPDATE approvals SET status = 'expired'
    WHERE org_id = (SELECT %(org_id)s::text) AND approval_id = %(approval_id)s
      AND status = (SELECT 'pending'::text)
    RETURNING org_id, run_id, seq, step_id, approval_id, deadline_at
),
hist AS (
    INSERT INTO history_log (org_id, run_id, event, seq, step_id, worker, detail)
    SELECT org_id, run_id, 'approval_expired', seq, step_id, %(worker)s,
           jsonb_build_object('approval_id', approval_id, 'deadline_at', deadline_at,
                              'policy', %(policy)s::text)
    FROM e
)
SELECT count(*) AS expired FROM e;

-- name: refused
-- A click or call that decided nothing, in the run's history: who, why.
INSERT INTO history_log (org_id, run_id, event, seq, step_id, worker, detail)
SELECT org_id, run_id, 'approval_refused', seq, step_id, %(worker)s,
       jsonb_build_object('approval_id', approval_id, 'by', %(decided_by)s::text,
                          'reason', %(reason)s::text, 'via', %(via)s::text)
FROM approvals WHERE org_id = (SELECT %(org_id)s::text) AND approval_id = %(approval_id)s;

-- name: list
-- An organisation's requests, newest first, narrowed by run or status.
SELECT a.approval_id, a.run_id, a.seq, a.step_id, a.request, a.digest, a.approvers, a.channel,
       a.status, a.decided_by, a.decided_via, a.decided_at, a.deadline_at, a.message_ts,
       a.created_at
FROM approvals a
WHERE a.org_id = (SELECT %(org_id)s::text)
  AND (%(run_id)s::text IS NULL OR a.run_id = %(run_id)s)
  AND (%(status)s::text IS NULL OR a.status = %(status)s)
ORDER BY a.created_at DESC, a.approval_id
LIMIT %(limit)s;

-- name: grant
-- Let a person decide (for one automation, or '*' for all); granting again restores a revoked
-- grant.
INSERT INTO approvers (org_id, approver, scope)
VALUES (%(org_id)s, %(approver)s, %(scope)s)
ON CONFLICT (org_id, approver, scope) DO UPDATE SET revoked_at = NULL, granted_at = now()
RETURNING approver, scope, granted_at, revoked_at;

-- name: revoke
-- Take the permission away; a click after this is refused, whatever the message says.
UPDATE approvers SET revoked_at = now()
WHERE org_id = (SELECT %(org_id)s::text) AND approver = %(approver)s AND scope = %(scope)s
  AND revoked_at IS NULL
RETURNING approver, scope, granted_at, revoked_at;

-- name: approvers
-- Every grant, live and revoked.
SELECT approver, scope, granted_at, revoked_at FROM approvers
WHERE org_id = (SELECT %(org_id)s::text) ORDER BY approver, scope;

-- name: secret
-- The engine's own secret of this name, made once (the first process to ask stores it; every
-- other process reads the same).
WITH ins AS (
    INSERT INTO engine_secrets (name, secret) VALUES (%(name)s, %(secret)s)
    ON CONFLICT (org_id, name) DO NOTHING
    RETURNING secret
)
SELECT secret FROM ins
UNION ALL
SELECT secret FROM engine_secrets WHERE org_id = '_system' AND name = %(name)s
LIMIT 1;

-- name: cancel_pending
-- The run was cancelled: its pending request decides nothing any more; a later click is refused
-- as cancelled (approvals.py _why_not reads the run's status).
UPDATE approvals SET status = 'cancelled'
WHERE org_id = (SELECT %(org_id)s::text) AND run_id = %(run_id)s AND status = 'pending'
RETURNING approval_id;
