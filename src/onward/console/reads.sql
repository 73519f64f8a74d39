-- What the console reads (issue 15): pages of runs, what one run's screen shows beside its
-- history, the parked list, versions. Every query names its organisation; none writes.
-- The page queries are sent unprepared (a custom plan per call): their "x IS NULL OR" filters
-- fold away, so each filter's own index (migration 0022) serves the page.

-- name: page_older
-- A page of runs, newest first, older than the cursor (created_at, run_id) when one is given.
-- Each run with its unfinished step (at most one, always its latest: migration 0034), looked
-- up by the run in steps_pkey: the LIMIT keeps the planner from turning the lateral into a
-- join that reads the organisation's every step and hashes it
-- (tests/integration/test_batch_plans.py). The step count as it is
-- now (onward_run_now, migration 0030).
SELECT r.run_id, r.automation_id, r.version, r.status, r.status_reason, r.contact_id,
       n.steps_executed, r.created_at, r.updated_at, r.finished_at,
       s.step_id AS step_id, s.status AS step_status, s.wait_kind, s.lane
FROM runs r
LEFT JOIN LATERAL (
    SELECT st.step_id, st.status, st.wait_kind, st.lane FROM steps st
    WHERE st.org_id = r.org_id AND st.run_id = r.run_id
    ORDER BY st.seq DESC LIMIT 1
) s ON s.status IN ('ready', 'running', 'waiting', 'parked')
CROSS JOIN LATERAL onward_run_now(r) AS n
WHERE r.org_id = (SELECT %(org_id)s::text)
  AND (%(status)s::text IS NULL OR r.status = %(status)s::text)
  AND (%(automation_id)s::text IS NULL OR r.automation_id = %(automation_id)s::text)
  AND (%(version)s::int IS NULL OR r.version = %(version)s::int)
  AND (%(contact_id)s::text IS NULL OR r.contact_id = %(contact_id)s::text)
  AND (%(parked)s::text IS NULL OR EXISTS (
         SELECT 1 FROM steps p
         WHERE p.org_id = r.org_id AND p.run_id = r.run_id AND p.status = 'parked'
           AND p.wait_kind = %(parked)s::text))
  AND (%(since)s::timestamptz IS NULL OR r.created_at >= %(since)s::timestamptz)
  AND (%(until)s::timestamptz IS NULL OR r.created_at < %(until)s::timestamptz)
  AND (%(cursor_at)s::timestamptz IS NULL
       OR (r.created_at, r.run_id) < (%(cursor_at)s::timestamptz, %(cursor_id)s::text))
ORDER BY r.created_at DESC, r.run_id DESC
LIMIT %(limit)s;

-- name: page_newer
-- The same filters, the runs just newer than the cursor (oldest first: the caller reverses).
SELECT r.run_id, r.automation_id, r.version, r.status, r.status_reason, r.contact_id,
       n.steps_executed, r.created_at, r.updated_at, r.finished_at,
       s.step_id AS step_id, s.status AS step_status, s.wait_kind, s.lane
FROM runs r
LEFT JOIN LATERAL (
    SELECT st.step_id, st.status, st.wait_kind, st.lane FROM steps st
    WHERE st.org_id = r.org_id AND st.run_id = r.run_id
    ORDER BY st.seq DESC LIMIT 1
) s ON s.status IN ('ready', 'running', 'waiting', 'parked')
CROSS JOIN LATERAL onward_run_now(r) AS n
WHERE r.org_id = (SELECT %(org_id)s::text)
  AND (%(status)s::text IS NULL OR r.status = %(status)s::text)
  AND (%(automation_id)s::text IS NULL OR r.automation_id = %(automation_id)s::text)
  AND (%(version)s::int IS NULL OR r.version = %(version)s::int)
  AND (%(contact_id)s::text IS NULL OR r.contact_id = %(contact_id)s::text)
  AND (%(parked)s::text IS NULL OR EXISTS (
         SELECT 1 FROM steps p
         WHERE p.org_id = r.org_id AND p.run_id = r.run_id AND p.status = 'parked'
           AND p.wait_kind = %(parked)s::text))
  AND (%(since)s::timestamptz IS NULL OR r.created_at >= %(since)s::timestamptz)
  AND (%(until)s::timestamptz IS NULL OR r.created_at < %(until)s::timestamptz)
  AND (r.created_at, r.run_id) > (%(cursor_at)s::timestamptz, %(cursor_id)s::text)
ORDER BY r.created_at, r.run_id
LIMIT %(limit)s;

-- name: unfinished_counts
-- How many runs are active, waiting and parked now (runs_by_version, the partial index of
-- unfinished runs with their status: its size is the work in progress, not the history).
SELECT status, count(*) AS runs FROM runs
WHERE org_id = (SELECT %(org_id)s::text) AND finished_at IS NULL
GROUP BY status;

-- name: run_more
-- What the console shows of a run beyond its summary, with the database clock for "when".
SELECT contact_id, cancel_requested_at, cancel_requested_by, forked_from, updated_at,
       now() AS db_now
FROM runs WHERE org_id = (SELECT %(org_id)s::text) AND run_id = %(run_id)s;

-- name: effects_of_run
-- Every outside effect of a run: its key (also the provider's idempotency key), state, attempts
-- and what the provider answered.
SELECT effect_key, seq, provider, status, attempts, owner_token, lease_until, first_attempt_at,
       last_attempt_at, settled_at, result, last_error, retry_approved_by, created_at
FROM effects WHERE org_id = (SELECT %(org_id)s::text) AND run_id = %(run_id)s
ORDER BY created_at, effect_key;

-- name: timers_of_run
-- Every timer of a run: its intent (rule and zone, or a duration), the instant computed from it,
-- and when (and by whom) it fired.
SELECT timer_id, seq, purpose, intent, due_at, wake_n, fired_at, fired_by, created_at
FROM timers WHERE org_id = (SELECT %(org_id)s::text) AND run_id = %(run_id)s
ORDER BY timer_id;

-- name: correlations_of_run
-- The correlation keys that route signals to a run (e.g. the message id of an email it sent).
SELECT key, seq, step_id, created_at FROM correlations
WHERE org_id = (SELECT %(org_id)s::text) AND run_id = %(run_id)s ORDER BY created_at;

-- name: parked
-- Parked runs, most recently parked first: the step, why, and since when.
SELECT r.run_id, r.automation_id, r.version, r.status_reason, r.contact_id, r.created_at,
       s.seq, s.step_id, s.kind, s.lane, s.wait_kind, s.error, s.updated_at AS parked_at
FROM steps s
JOIN runs r ON r.org_id = s.org_id AND r.run_id = s.run_id
WHERE s.org_id = (SELECT %(org_id)s::text) AND s.status = 'parked'
  AND (%(wait_kind)s::text IS NULL OR s.wait_kind = %(wait_kind)s::text)
ORDER BY s.updated_at DESC, r.run_id
LIMIT %(limit)s;

-- name: in_review
-- Effects waiting for a person (their runs are parked for review).
SELECT effect_key, run_id, seq, provider, attempts, last_attempt_at, result, last_error
FROM effects WHERE org_id = (SELECT %(org_id)s::text) AND status = 'review'
ORDER BY run_id, seq, effect_key
LIMIT %(limit)s;

-- name: versions_of
-- The published versions of one automation, newest first.
SELECT version, digest, start_step_id, max_steps, max_age_s, published_at
FROM automation_versions WHERE org_id = (SELECT %(org_id)s::text) AND automation_id = %(automation_id)s
ORDER BY version DESC;

-- name: version_row
-- One published version with its document as stored.
SELECT version, digest, document, start_step_id, max_steps, max_age_s, published_at
FROM automation_versions
WHERE org_id = (SELECT %(org_id)s::text) AND automation_id = %(automation_id)s AND version = %(version)s;

-- name: unfinished_by_version
-- Unfinished runs of one automation per version and status (runs_by_version: the work in
-- progress only; finished runs are counted by the list's filters, a page at a time).
SELECT version, status, count(*) AS runs FROM runs
WHERE org_id = (SELECT %(org_id)s::text) AND automation_id = %(automation_id)s AND finished_at IS NULL
GROUP BY version, status ORDER BY version DESC, status;
