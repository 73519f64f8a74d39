-- Circuit breakers (R5): one row per key ('provider:<name>', 'connection:<id>'), in
-- PostgreSQL so every process sees the same state. Closed -> open (threshold failures in a
-- window) -> half_open (after the cool-down: one probe) -> closed (the probe succeeded: every
-- step parked on it resumes) or open again (the probe failed).

-- name: not_closed
-- The circuits of these keys that are not closed (none: the call goes through).
SELECT key, state, probe_run_id, probe_seq, retry_at FROM circuits
WHERE org_id = (SELECT %(org_id)s::text) AND key = ANY (%(keys)s::text[]) AND state <> 'closed'
ORDER BY key;

-- name: take_probe
-- A half-open circuit with no probe yet takes this step as its probe -- as does one whose
-- probe is another step when this step already probes another circuit of the same call
-- (%(steal)s): the circuits of one call (its connection's and its provider's) then share one
-- probe, and two probes never wait on each other.
UPDATE circuits SET probe_run_id = %(run_id)s, probe_seq = %(seq)s, updated_at = now()
WHERE org_id = (SELECT %(org_id)s::text) AND key = %(key)s AND state = 'half_open'
  AND (probe_run_id IS NULL OR (probe_run_id = %(run_id)s AND probe_seq = %(seq)s)
       OR %(steal)s)
RETURNING key;

-- name: fail
-- Count a failure of a call under this key (if it has a circuit: configured), in the circuit's
-- window (a new window when the
-- last one ended). The threshold reached in a closed circuit, or any failure of a half-open
-- circuit (its probe failed), opens it until now + cool-down, with a history row on the run
-- whose failure opened it. Answers the state after, and whether this failure opened it.
WITH cur AS (
    SELECT * FROM circuits WHERE org_id = (SELECT %(org_id)s::text) AND key = %(key)s FOR UPDATE
),
next AS (
    SELECT cur.org_id, cur.key,
           CASE WHEN cur.window_started_at IS NULL
                  OR cur.window_started_at < now() - make_interval(secs => cur.window_seconds)
                THEN 1 ELSE cur.failures + 1 END AS failures,
           CASE WHEN cur.window_started_at IS NULL
                  OR cur.window_started_at < now() - make_interval(secs => cur.window_seconds)
                THEN now() ELSE cur.window_started_at END AS window_started_at,
           cur.state AS was, cur.threshold, cur.cooldown_seconds
    FROM cur
),
upd AS (
    UPDATE circuits c
    SET failures = n.failures, window_started_at = n.window_started_at,
        state = CASE WHEN n.was = 'half_open' OR (n.was = 'closed' AND n.failures >= n.threshold)
                     THEN 'open' ELSE c.state END,
        opened_at = CASE WHEN n.was = 'half_open' OR (n.was = 'closed' AND n.failures >= n.threshold)
                         THEN now() ELSE c.opened_at END,
        retry_at = CASE WHEN n.was = 'half_open' OR (n.was = 'closed' AND n.failures >= n.threshold)
                        THEN now() + make_interval(secs => n.cooldown_seconds) ELSE c.retry_at END,
        probe_run_id = CASE WHEN n.was = 'half_open' THEN NULL ELSE c.probe_run_id END,
        probe_seq = CASE WHEN n.was = 'half_open' THEN NULL ELSE c.probe_seq END,
        updated_at = now()
    FROM next n
    WHERE c.org_id = n.org_id AND c.key = n.key
    RETURNING c.key, c.state, c.failures, c.retry_at, n.was
),
hist AS (
    INSERT INTO history_log (org_id, run_id, event, seq, worker, detail)
    SELECT %(org_id)s, %(run_id)s, 'circuit_opened', %(seq)s, %(worker)s,
           jsonb_build_object('circuit', key, 'failures', failures, 'retry_at', retry_at,
                              'was', was)
    FROM upd WHERE state = 'open' AND was <> 'open'
)
SELECT key, state, failures, retry_at, (state = 'open' AND was <> 'open') AS opened FROM upd;

-- name: half_open_due
-- The cool-down of open circuits passed: each becomes half-open, and one step parked on it
-- (the longest parked) is made ready as its probe, with a history row; a circuit with no
-- parked step waits half-open for the next call, which becomes its probe. A half-open circuit
-- whose probe went elsewhere (its step ended without a call: failed, cancelled, parked for
-- another reason) for longer than a cool-down gets a new probe the same way. Bounded, SKIP
-- LOCKED.
WITH due AS (
    SELECT c.org_id, c.key FROM circuits c
    WHERE (c.state = 'open' AND c.retry_at <= now())
       OR (c.state = 'half_open'
           AND c.updated_at < now() - make_interval(secs => c.cooldown_seconds)
           AND NOT EXISTS (
               SELECT 1 FROM steps st
               WHERE st.org_id = c.org_id AND st.run_id = c.probe_run_id
                 AND st.seq = c.probe_seq AND st.status IN ('ready', 'running')))
    ORDER BY c.retry_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
),
probe AS (
    SELECT DISTINCT ON (d.org_id, d.key) d.org_id, d.key, st.run_id, st.seq
    FROM due d
    JOIN steps st ON st.org_id = d.org_id AND st.status = 'parked' AND st.wait_kind = 'circuit'
                 AND st.error ->> 'circuit' = d.key
    ORDER BY d.org_id, d.key, st.updated_at
),
upd AS (
    UPDATE circuits c
    SET state = 'half_open', probe_run_id = p.run_id, probe_seq = p.seq, updated_at = now()
    FROM due d LEFT JOIN probe p ON p.org_id = d.org_id AND p.key = d.key
    WHERE c.org_id = d.org_id AND c.key = d.key
    RETURNING c.org_id, c.key, c.probe_run_id, c.probe_seq
),
to_ready AS (
    SELECT u.org_id, u.probe_run_id AS run_id, u.probe_seq AS seq, 'parked' AS from_status,
           NULL::int AS attempt, now() AS available_at,
           jsonb_build_object('by', 'circuit_probe', 'circuit', u.key) AS wake,
           NULL::jsonb AS error, 'circuit_half_open' AS event, %(worker)s::text AS worker,
           jsonb_build_object('circuit', u.key, 'probe', true) AS detail
    FROM upd u WHERE u.probe_run_id IS NOT NULL
),
{{make_ready}},
run AS (
    UPDATE runs r SET status = 'active', status_reason = NULL, updated_at = now()
    FROM ready
    WHERE r.org_id = ready.org_id AND r.run_id = ready.run_id AND r.status = ready.from_status
)
SELECT org_id, key, probe_run_id FROM upd;

-- name: close
-- The probe (this step) of a half-open circuit succeeded: the circuit closes, and every step parked on it
-- resumes from the same step (ready, with a wake and a `circuit_closed` history row per run),
-- in one statement.
WITH c AS (
    UPDATE circuits
    SET state = 'closed', failures = 0, window_started_at = NULL, probe_run_id = NULL,
        probe_seq = NULL, updated_at = now()
    WHERE org_id = (SELECT %(org_id)s::text) AND key = ANY (%(keys)s::text[]) AND state = 'half_open'
      AND probe_run_id = %(run_id)s AND probe_seq = %(seq)s
    RETURNING org_id, key
),
to_ready AS (
    SELECT st.org_id, st.run_id, st.seq, 'parked' AS from_status, NULL::int AS attempt,
           now() AS available_at, jsonb_build_object('by', 'circuit', 'circuit', c.key) AS wake,
           NULL::jsonb AS error, 'circuit_closed' AS event, %(worker)s::text AS worker,
           jsonb_build_object('circuit', c.key) AS detail
    FROM steps st JOIN c ON st.org_id = c.org_id
    -- the organisation's steps parked on a circuit (steps_parked by org and kind: the org is
    -- the parameter, so never every organisation's parked steps hashed against the circuit)
    WHERE st.org_id = (SELECT %(org_id)s::text) AND st.status = 'parked' AND st.wait_kind = 'circuit'
      AND st.error ->> 'circuit' = c.key
),
{{make_ready}},
run AS (
    UPDATE runs r SET status = 'active', status_reason = NULL, updated_at = now()
    FROM ready
    WHERE r.org_id = ready.org_id AND r.run_id = ready.run_id AND r.status = ready.from_status
)
SELECT c.key, (SELECT count(*) FROM ready) AS resumed FROM c;

-- name: resume_stranded
-- The backstop for a park that raced a close: a step reads its circuit open (circuits.admit)
-- and parks in its settle, a statement later; a probe's close committed in between resumed the
-- steps parked when it ran -- not this one. A step parked on a circuit that is closed now (or
-- no longer configured) is made ready from the same step, with a `circuit_closed` history row
-- (detail `stranded`). Bounded; served by steps_parked.
WITH to_ready AS (
    SELECT st.org_id, st.run_id, st.seq, 'parked' AS from_status, NULL::int AS attempt,
           now() AS available_at,
           jsonb_build_object('by', 'circuit', 'circuit', st.error ->> 'circuit') AS wake,
           NULL::jsonb AS error, 'circuit_closed' AS event, %(worker)s::text AS worker,
           jsonb_build_object('circuit', st.error ->> 'circuit', 'stranded', true) AS detail
    FROM steps st
    WHERE st.status = 'parked' AND st.wait_kind = 'circuit'
      AND NOT EXISTS (
          SELECT 1 FROM circuits c
          WHERE c.org_id = st.org_id AND c.key = st.error ->> 'circuit' AND c.state <> 'closed')
    LIMIT %(limit)s
),
{{make_ready}},
run AS (
    UPDATE runs r SET status = 'active', status_reason = NULL, updated_at = now()
    FROM ready
    WHERE r.org_id = ready.org_id AND r.run_id = ready.run_id AND r.status = ready.from_status
)
SELECT org_id, run_id, seq FROM ready;

-- name: configure
-- Set a key's thresholds (creating its closed circuit if it has none yet).
INSERT INTO circuits (org_id, key, threshold, window_seconds, cooldown_seconds)
VALUES (%(org_id)s, %(key)s, %(threshold)s, %(window_seconds)s, %(cooldown_seconds)s)
ON CONFLICT (org_id, key) DO UPDATE
SET threshold = EXCLUDED.threshold, window_seconds = EXCLUDED.window_seconds,
    cooldown_seconds = EXCLUDED.cooldown_seconds, updated_at = now()
RETURNING key, state, threshold, window_seconds, cooldown_seconds;

-- name: list
-- Every circuit, with the steps parked on it.
SELECT c.key, c.state, c.failures, c.window_started_at, c.opened_at, c.retry_at,
       c.probe_run_id, c.probe_seq, c.threshold, c.window_seconds, c.cooldown_seconds,
       (SELECT count(*) FROM steps st
        WHERE st.org_id = c.org_id AND st.status = 'parked' AND st.wait_kind = 'circuit'
          AND st.error ->> 'circuit' = c.key) AS parked
FROM circuits c WHERE c.org_id = (SELECT %(org_id)s::text) ORDER BY c.key;

-- name: open_everywhere
-- Circuits not closed, in every organisation (doctor).
SELECT org_id, key, state, opened_at, retry_at FROM circuits
WHERE state <> 'closed' ORDER BY org_id, key LIMIT %(limit)s;
