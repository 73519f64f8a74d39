-- The readers and checks of onward.testing: what tests and `onward chaos` read from the rows.
-- %(org)s NULL means every organisation (a test's own database). The checks leave out the runs
-- in %(skip)s: erased runs, whose history details are redacted (onward.erasure).

-- name: history
-- A run's history rows, oldest first: only the named events (all when none), one seq or all.
SELECT event_id, at, event, seq, step_id, attempt, worker, claimed_at, detail
FROM history
WHERE run_id = %(run_id)s
  AND (%(org)s::text IS NULL OR org_id = (SELECT %(org)s::text))
  AND (cardinality(%(events)s::text[]) = 0 OR event = ANY(%(events)s::text[]))
  AND (%(seq)s::int IS NULL OR seq = %(seq)s::int)
ORDER BY event_id;

-- name: attempts
-- Every claim of a run's steps, oldest first: the attempts that ended (the history row that
-- ended each: a settle, step_retry, step_deferred, step_released, lease_expired -- its worker,
-- for lease_expired the owner the sweeper found) and the ones running now (the step row).
SELECT seq, step_id, attempt, worker, claimed_at, ended FROM (
    SELECT h.seq, h.step_id, h.attempt, h.claimed_at, h.event AS ended,
           CASE WHEN h.event = 'lease_expired' THEN h.detail->>'owner' ELSE h.worker END
               AS worker
    FROM history h
    WHERE h.run_id = %(run_id)s AND (%(org)s::text IS NULL OR h.org_id = (SELECT %(org)s::text))
      AND h.claimed_at IS NOT NULL
    UNION ALL
    SELECT s.seq, s.step_id, s.attempt, s.claimed_at, NULL, s.owner
    FROM steps s
    WHERE s.run_id = %(run_id)s AND (%(org)s::text IS NULL OR s.org_id = (SELECT %(org)s::text))
      AND s.status = (SELECT 'running'::text)  -- not the whole of steps_leased (leases.sql)
) a
WHERE %(seq)s::int IS NULL OR seq = %(seq)s::int
ORDER BY claimed_at, seq, attempt;

-- name: step_row
-- One step of a run, with whether its lease has lapsed by the database's clock.
SELECT s.*, s.lease_until <= now() AS lapsed
FROM steps s
WHERE s.run_id = %(run_id)s AND s.seq = %(seq)s
  AND (%(org)s::text IS NULL OR s.org_id = (SELECT %(org)s::text));

-- name: steps
-- A run's step rows, by position: only one step id's rows when given.
SELECT * FROM steps
WHERE run_id = %(run_id)s
  AND (%(org)s::text IS NULL OR org_id = (SELECT %(org)s::text))
  AND (%(step_id)s::text IS NULL OR step_id = %(step_id)s::text)
ORDER BY seq;

-- name: run_row
-- One run.
SELECT * FROM runs
WHERE run_id = %(run_id)s AND (%(org)s::text IS NULL OR org_id = (SELECT %(org)s::text));

-- name: effect_row
-- One effect, by its key.
SELECT * FROM effects
WHERE effect_key = %(key)s AND (%(org)s::text IS NULL OR org_id = (SELECT %(org)s::text));

-- name: run_effects
-- A run's effects, by key.
SELECT * FROM effects
WHERE run_id = %(run_id)s AND (%(org)s::text IS NULL OR org_id = (SELECT %(org)s::text))
ORDER BY effect_key;

-- name: unfinished_runs
-- Runs neither finished nor parked for a person.
SELECT run_id FROM runs
WHERE (%(org)s::text IS NULL OR org_id = (SELECT %(org)s::text)) AND status <> ALL(%(settled)s::text[]);

-- name: claim_or_wait_twice
-- A claim (older rows), a done, a wait or a timer firing written twice for one attempt of
-- one step.
SELECT count(*) AS n FROM (
    SELECT org_id, run_id, seq, attempt, event FROM history
    WHERE (%(org)s::text IS NULL OR org_id = (SELECT %(org)s::text)) AND run_id <> ALL(%(skip)s::text[])
      AND event IN ('step_claimed', 'step_done', 'step_waiting', 'timer_fired')
    GROUP BY 1, 2, 3, 4, 5 HAVING count(*) > 1) x;

-- name: step_done_twice
-- A step done twice, whatever the attempts.
SELECT count(*) AS n FROM (
    SELECT org_id, run_id, seq FROM history
    WHERE (%(org)s::text IS NULL OR org_id = (SELECT %(org)s::text)) AND run_id <> ALL(%(skip)s::text[])
      AND event = 'step_done'
    GROUP BY 1, 2, 3 HAVING count(*) > 1) x;

-- name: timer_fired_twice
-- A timer fired twice.
SELECT count(*) AS n FROM (
    SELECT org_id, detail->>'timer_id' FROM history
    WHERE (%(org)s::text IS NULL OR org_id = (SELECT %(org)s::text)) AND run_id <> ALL(%(skip)s::text[])
      AND event = 'timer_fired'
    GROUP BY 1, 2 HAVING count(*) > 1) x;

-- name: run_completed_twice
-- A run completed twice: its last step's row says so (detail.run), or, in rows written before
-- 0024, a run_completed row.
SELECT count(*) AS n FROM (
    SELECT org_id, run_id FROM history
    WHERE (%(org)s::text IS NULL OR org_id = (SELECT %(org)s::text)) AND run_id <> ALL(%(skip)s::text[])
      AND (event = 'run_completed' OR detail->>'run' = 'completed')
    GROUP BY 1, 2 HAVING count(*) > 1) x;

-- name: settled_by_a_stale_attempt
-- A step settled by an attempt after that attempt had been given up -- its lease expired or it
-- was released -- or after a later attempt had ended: the fence failed. (A park followed by a
-- later attempt is a resume -- a circuit closed, a budget raised, a connection restored -- not
-- a stale settle: only rows before the settle count.)
SELECT count(*) AS n FROM history d
WHERE (%(org)s::text IS NULL OR d.org_id = (SELECT %(org)s::text)) AND d.run_id <> ALL(%(skip)s::text[])
  AND d.event IN ('step_done', 'step_failed', 'step_parked', 'step_cancelled')
  AND EXISTS (SELECT 1 FROM history c
              WHERE c.org_id = d.org_id AND c.run_id = d.run_id AND c.seq = d.seq
                AND c.event_id < d.event_id
                AND (c.attempt > d.attempt
                     OR (c.attempt = d.attempt
                         AND c.event IN ('lease_expired', 'step_released'))));

-- name: steps_done_per_seq
-- Two step rows at one position of a run.
SELECT count(*) AS n FROM (
    SELECT org_id, run_id, seq FROM steps
    WHERE (%(org)s::text IS NULL OR org_id = (SELECT %(org)s::text)) AND run_id <> ALL(%(skip)s::text[])
    GROUP BY 1, 2, 3 HAVING count(*) > 1) x;
