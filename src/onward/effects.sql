-- Outside effects (R4): at least once, made idempotent. The effect key names the effect
-- ("<run_id>/<step_id>/<iteration>"), never the attempt. The effect row has its own lease and
-- owner token, separate from the step's: a replacement never calls the provider while an
-- earlier call may still be running.
--
-- Every transition but the heartbeat writes its history row (effect_claimed, effect_settled,
-- effect_reconciled, effect_not_done, effect_unknown, effect_review) in its own statement, so
-- the run's timeline holds exactly the transitions that committed (R17). The row is filed under
-- the effect's run and step entry, with the step's attempt and worker of whoever wrote it;
-- %(note)s is its detail as the caller built it (effect key, idempotency key, provider, the
-- redacted excerpt of the request or result), to which the statement adds the effect's own
-- attempt number (owner_token) as it committed.
--
-- A statement that names its effect by key fences on its status as `(SELECT '<status>'::text)`,
-- a value the planner does not see: a literal would let it read the organisation's every
-- unsettled effect (or every one in review) through the partial index effects_unsettled
-- (effects_review) whose predicate it implies, whenever its statistics call that index nearly
-- empty, instead of the one row by effects_pkey (tests/integration/test_batch_plans.py).

-- name: claim
-- First attempt: create the row in_flight, owned by token 1, with its lease -- unless the run was
-- cancelled (R12): the run row is read with a lock (FOR KEY SHARE) in this statement, so a cancel
-- committing meanwhile is seen (the lock waits for it) and one coming later waits for this claim
-- to commit: no call starts after a cancel commits except one claimed before it. owner_token
-- NULL and not cancelled: the effect exists already; read it (read) and decide.
WITH run AS (
    SELECT cancel_requested_at IS NOT NULL AS cancelled FROM runs
    WHERE org_id = (SELECT %(org_id)s::text) AND run_id = %(run_id)s
    FOR KEY SHARE
),
ins AS (
    INSERT INTO effects (org_id, effect_key, run_id, seq, provider, status, owner_token,
                         lease_until, attempts, first_attempt_at, last_attempt_at)
    SELECT %(org_id)s, %(effect_key)s, %(run_id)s, %(seq)s, %(provider)s, 'in_flight', 1,
           now() + make_interval(secs => %(lease)s), 1, now(), now()
    WHERE NOT EXISTS (SELECT 1 FROM run WHERE cancelled)
    ON CONFLICT (org_id, effect_key) DO NOTHING
    RETURNING run_id, seq, owner_token
),
hist AS (
    INSERT INTO history_log (org_id, run_id, event, seq, step_id, attempt, worker, detail)
    SELECT %(org_id)s, run_id, 'effect_claimed', seq, %(step_id)s, %(attempt)s, %(worker)s,
           %(note)s::jsonb || jsonb_build_object('effect_attempt', owner_token)
    FROM ins
)
SELECT (SELECT owner_token FROM ins) AS owner_token,
       coalesce((SELECT cancelled FROM run), false) AS cancelled;

-- name: read
-- The effect as it stands, with whether its lease is still live by the database clock.
SELECT effect_key, status, owner_token, attempts, first_attempt_at, last_attempt_at, result,
       last_error, lease_until, retry_approved_by, coalesce(lease_until > now(), false) AS lease_live,
       greatest(0, extract(epoch FROM lease_until - now()))::float8 AS lease_left_s
FROM effects WHERE org_id = (SELECT %(org_id)s::text) AND effect_key = %(effect_key)s;

-- name: lapse
-- An in_flight effect whose lease expired: a call began and nobody recorded its end, so the
-- outcome is unknown. Only this transition may turn a lapsed call into a retry candidate.
WITH up AS (
    UPDATE effects SET status = 'outcome_unknown',
                       last_error = coalesce(last_error, '{}'::jsonb) || '{"lapsed": true}'::jsonb
    WHERE org_id = (SELECT %(org_id)s::text) AND effect_key = %(effect_key)s
      AND status = (SELECT 'in_flight'::text) AND lease_until < now()
    RETURNING run_id, seq, owner_token, lease_until
),
hist AS (
    INSERT INTO history_log (org_id, run_id, event, seq, step_id, attempt, worker, detail)
    SELECT %(org_id)s, run_id, 'effect_unknown', seq, %(step_id)s, %(attempt)s, %(worker)s,
           %(note)s::jsonb || jsonb_build_object('effect_attempt', owner_token, 'lapsed', true,
                                                 'lease_until', lease_until)
    FROM up
)
SELECT owner_token FROM up;

-- name: begin_attempt
-- A new attempt of an effect whose outcome is unknown (after reconcile found nothing, for a
-- provider that deduplicates the idempotency key, or one a person allowed: retry_approved_by):
-- a new owner token and a new lease (a person's permission is spent by the attempt it allowed) -- unless
-- the run was cancelled, read with a lock as in claim: a cancelled run's effect stays
-- outcome_unknown (reconciled, never called again, never claimed undone).
WITH run AS (
    SELECT cancel_requested_at IS NOT NULL AS cancelled FROM runs
    WHERE org_id = (SELECT %(org_id)s::text) AND run_id = %(run_id)s
    FOR KEY SHARE
),
up AS (
    UPDATE effects
    SET status = 'in_flight', owner_token = owner_token + 1, attempts = attempts + 1,
        lease_until = now() + make_interval(secs => %(lease)s), last_attempt_at = now(),
        retry_approved_by = NULL
    WHERE org_id = (SELECT %(org_id)s::text) AND effect_key = %(effect_key)s
      AND status = (SELECT 'outcome_unknown'::text)
      AND NOT EXISTS (SELECT 1 FROM run WHERE cancelled)
    RETURNING run_id, seq, owner_token
),
hist AS (
    INSERT INTO history_log (org_id, run_id, event, seq, step_id, attempt, worker, detail)
    SELECT %(org_id)s, run_id, 'effect_claimed', seq, %(step_id)s, %(attempt)s, %(worker)s,
           %(note)s::jsonb || jsonb_build_object('effect_attempt', owner_token, 'repeat', true)
    FROM up
)
SELECT (SELECT owner_token FROM up) AS owner_token,
       coalesce((SELECT cancelled FROM run), false) AS cancelled;

-- name: heartbeat
-- Extend the effect lease while the call runs, only while this token owns it.
UPDATE effects SET lease_until = now() + make_interval(secs => %(lease)s)
WHERE org_id = (SELECT %(org_id)s::text) AND effect_key = %(effect_key)s
  AND owner_token = %(token)s AND status = (SELECT 'in_flight'::text)
RETURNING lease_until;

-- name: settle
-- Record the provider's result. A result is a fact: whoever learns it first records it, even a
-- call whose lease lapsed meanwhile; a settled result is never overwritten. %(event)s:
-- effect_settled (the call answered) or effect_reconciled (found at the provider by its key).
WITH up AS (
    UPDATE effects
    SET status = 'settled', result = %(result)s, settled_at = now(), lease_until = NULL
    WHERE org_id = (SELECT %(org_id)s::text) AND effect_key = %(effect_key)s AND status <> 'settled'
    RETURNING run_id, seq, owner_token, result
),
hist AS (
    INSERT INTO history_log (org_id, run_id, event, seq, step_id, attempt, worker, detail)
    SELECT %(org_id)s, run_id, %(event)s, seq, %(step_id)s, %(attempt)s, %(worker)s,
           %(note)s::jsonb || jsonb_build_object('effect_attempt', owner_token)
    FROM up
)
SELECT result FROM up;

-- name: mark_unknown
-- The call may have happened (the connection dropped after sending): keep the row, unknown.
WITH up AS (
    UPDATE effects
    SET status = 'outcome_unknown', lease_until = NULL, last_error = %(error)s
    WHERE org_id = (SELECT %(org_id)s::text) AND effect_key = %(effect_key)s
      AND owner_token = %(token)s AND status = (SELECT 'in_flight'::text)
    RETURNING run_id, seq, owner_token
),
hist AS (
    INSERT INTO history_log (org_id, run_id, event, seq, step_id, attempt, worker, detail)
    SELECT %(org_id)s, run_id, 'effect_unknown', seq, %(step_id)s, %(attempt)s, %(worker)s,
           %(note)s::jsonb || jsonb_build_object('effect_attempt', owner_token)
    FROM up
)
SELECT owner_token FROM up;

-- name: forget_attempt
-- The provider answered that it did not do the work (429, 401, 4xx, 5xx): nothing happened,
-- so the claim is withdrawn and the next attempt starts clean.
WITH gone AS (
    DELETE FROM effects
    WHERE org_id = (SELECT %(org_id)s::text) AND effect_key = %(effect_key)s
      AND owner_token = %(token)s AND status = (SELECT 'in_flight'::text) AND attempts = 1
    RETURNING effect_key, run_id, seq, owner_token
),
hist AS (
    INSERT INTO history_log (org_id, run_id, event, seq, step_id, attempt, worker, detail)
    SELECT %(org_id)s, run_id, 'effect_not_done', seq, %(step_id)s, %(attempt)s, %(worker)s,
           %(note)s::jsonb || jsonb_build_object('effect_attempt', owner_token,
                                                 'now', 'withdrawn')
    FROM gone
)
SELECT effect_key FROM gone;

-- name: back_to_unknown
-- As forget_attempt, for an effect that had earlier uncertain attempts: it stays unknown.
WITH up AS (
    UPDATE effects SET status = 'outcome_unknown', lease_until = NULL, last_error = %(error)s
    WHERE org_id = (SELECT %(org_id)s::text) AND effect_key = %(effect_key)s
      AND owner_token = %(token)s AND status = (SELECT 'in_flight'::text)
    RETURNING run_id, seq, owner_token
),
hist AS (
    INSERT INTO history_log (org_id, run_id, event, seq, step_id, attempt, worker, detail)
    SELECT %(org_id)s, run_id, 'effect_not_done', seq, %(step_id)s, %(attempt)s, %(worker)s,
           %(note)s::jsonb || jsonb_build_object('effect_attempt', owner_token,
                                                 'now', 'outcome_unknown')
    FROM up
)
SELECT owner_token FROM up;

-- name: park_for_review
-- No safe way to retry: a person decides. The row keeps what is known.
WITH up AS (
    UPDATE effects SET status = 'review', lease_until = NULL,
                       last_error = coalesce(%(error)s, last_error)
    WHERE org_id = (SELECT %(org_id)s::text) AND effect_key = %(effect_key)s
      AND status = (SELECT 'outcome_unknown'::text)
    RETURNING run_id, seq, owner_token, first_attempt_at, attempts, last_error
),
hist AS (
    INSERT INTO history_log (org_id, run_id, event, seq, step_id, attempt, worker, detail)
    SELECT %(org_id)s, run_id, 'effect_review', seq, %(step_id)s, %(attempt)s, %(worker)s,
           %(note)s::jsonb || jsonb_build_object('effect_attempt', owner_token,
                                                 'attempts', attempts,
                                                 'first_attempt_at', first_attempt_at,
                                                 'last_error', last_error)
    FROM up
)
SELECT first_attempt_at, attempts, last_error FROM up;

-- name: in_review
-- The effects of one step entry that wait for a person (effects_review), locked: a person's
-- resolution and a late result (settle) are ordered.
SELECT effect_key, provider, attempts, first_attempt_at, last_attempt_at, last_error
FROM effects
WHERE org_id = (SELECT %(org_id)s::text) AND run_id = %(run_id)s AND seq = %(seq)s AND status = 'review'
ORDER BY effect_key
FOR UPDATE;

-- name: resolve_happened
-- A person checked with the provider: the call happened, and this is its result (with the
-- provider's reference). Every later attempt returns it without calling the provider.
UPDATE effects
SET status = 'settled', result = %(result)s, settled_at = now(), lease_until = NULL
WHERE org_id = (SELECT %(org_id)s::text) AND effect_key = %(effect_key)s AND status = (SELECT 'review'::text)
RETURNING effect_key, result;

-- name: resolve_retry
-- A person allows one more attempt with the same idempotency key (the provider does not
-- deduplicate it: they checked that the call did not happen, or accept a repeat).
UPDATE effects
SET status = 'outcome_unknown', retry_approved_by = %(by)s, lease_until = NULL
WHERE org_id = (SELECT %(org_id)s::text) AND effect_key = %(effect_key)s AND status = (SELECT 'review'::text)
RETURNING effect_key;

-- name: resolve_skip
-- A person lets the run go on without this effect: it is never called again.
UPDATE effects SET status = 'skipped', lease_until = NULL
WHERE org_id = (SELECT %(org_id)s::text) AND effect_key = %(effect_key)s AND status = (SELECT 'review'::text)
RETURNING effect_key;

-- name: unsettled_of_step
-- The effects of one step entry whose outcome is not recorded (in_flight or outcome_unknown):
-- a cancelled run's step with one runs its kind once more, to reconcile it (never to call).
-- Read by the run (effects_by_run): the statuses are a value the planner does not see, so it
-- never reads the organisation's every unsettled effect through effects_unsettled.
SELECT effect_key, status FROM effects
WHERE org_id = (SELECT %(org_id)s::text)
  AND status = ANY ((SELECT ARRAY['in_flight', 'outcome_unknown'])::text[])
  AND run_id = %(run_id)s AND seq = %(seq)s
LIMIT 1;
