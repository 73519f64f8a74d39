-- The health page (R18): the doctor's measurements (onward/doctor.sql) for one organisation --
-- the console never reads across organisations -- and their last hour, minute by minute, where
-- rows keep that hour (timers, effects, runs, sent outbox rows).

-- name: no_way_forward
-- The organisation's unfinished runs untouched for `settle` seconds with no durable way forward
-- (doctor.sql no_way_forward, for one organisation).
SELECT r.run_id, r.status, s.seq, s.status AS step_status, s.wait_kind, r.updated_at
FROM runs r
LEFT JOIN LATERAL (  -- the run's latest step, its unfinished one if any (migration 0034)
    SELECT st.org_id, st.run_id, st.seq, st.status, st.wait_kind FROM steps st
    WHERE st.org_id = r.org_id AND st.run_id = r.run_id
    ORDER BY st.seq DESC LIMIT 1
) s ON s.status IN ('ready', 'running', 'waiting', 'parked')
WHERE r.org_id = (SELECT %(org_id)s::text) AND r.finished_at IS NULL
  AND r.updated_at < now() - make_interval(secs => %(settle)s)
  AND (s.seq IS NULL
       OR (s.status = 'waiting' AND NOT EXISTS (
              SELECT 1 FROM timers t
              WHERE t.org_id = s.org_id AND t.run_id = s.run_id AND t.seq = s.seq
                AND t.fired_at IS NULL)))
ORDER BY r.updated_at
LIMIT %(limit)s;

-- name: overdue_timers
-- The organisation's timers due longer ago than the grace and not fired (timers_due).
SELECT count(*) AS overdue, min(due_at) AS oldest,
       coalesce(extract(epoch FROM now() - min(due_at)), 0)::float8 AS oldest_age_s
FROM timers
WHERE org_id = (SELECT %(org_id)s::text) AND fired_at IS NULL
  AND due_at < now() - make_interval(secs => %(grace)s);

-- name: outbox_lag
-- Wake-ups of the organisation due and not yet published: how many, and the oldest's age.
SELECT count(*) AS unsent,
       coalesce(extract(epoch FROM now() - min(deliver_at)), 0)::float8 AS oldest_age_s
FROM outbox
WHERE sent_at IS NULL AND deliver_at <= now() AND org_id = (SELECT %(org_id)s::text);

-- name: unsettled_effects
-- Effects claimed and not settled, by state, with the oldest first attempt (effects_unsettled
-- for in_flight / outcome_unknown; review, a person's to resolve, is listed but never fails
-- the check, and is shown on the parked list too).
SELECT status, count(*) AS effects,
       coalesce(extract(epoch FROM now() - min(coalesce(first_attempt_at, created_at))), 0)::float8
           AS oldest_age_s
FROM effects
WHERE org_id = (SELECT %(org_id)s::text) AND status IN ('in_flight', 'outcome_unknown', 'review')
GROUP BY status ORDER BY status;

-- name: lanes
-- Per lane: ready steps claimable now and the age of the oldest, running steps, and steps
-- parked on a circuit or a budget (doctor.sql lanes, for one organisation: its statuses as
-- ORs, for the same reason).
SELECT lane,
       count(*) FILTER (WHERE status = 'ready' AND available_at <= now()) AS ready,
       coalesce(extract(epoch FROM now() - min(available_at)
                FILTER (WHERE status = 'ready' AND available_at <= now())), 0)::float8
           AS oldest_ready_s,
       count(*) FILTER (WHERE status = 'running') AS running,
       count(*) FILTER (WHERE status = 'parked') AS parked
FROM steps
WHERE org_id = (SELECT %(org_id)s::text)
  AND (status = 'ready' OR status = 'running' OR status = 'parked')
GROUP BY lane
ORDER BY lane;

-- name: timer_lateness_by_minute
-- Timers fired in the last hour: per minute, the largest lateness (fired_at - due_at) and how
-- many fired (timers_fired).
SELECT floor(extract(epoch FROM now() - fired_at) / 60)::int AS minutes_ago,
       max(extract(epoch FROM fired_at - due_at))::float8 AS worst_s,
       count(*) AS fired
FROM timers
WHERE org_id = (SELECT %(org_id)s::text) AND fired_at IS NOT NULL AND fired_at > now() - interval '1 hour'
GROUP BY 1;

-- name: runs_by_minute
-- Runs started and finished in the last hour, per minute (runs_page, runs_finished).
SELECT floor(extract(epoch FROM now() - at) / 60)::int AS minutes_ago,
       count(*) FILTER (WHERE what = 'started') AS started,
       count(*) FILTER (WHERE what = 'finished') AS finished
FROM (
    SELECT created_at AS at, 'started' AS what FROM runs
    WHERE org_id = (SELECT %(org_id)s::text) AND created_at > now() - interval '1 hour'
    UNION ALL
    SELECT finished_at, 'finished' FROM runs
    WHERE org_id = (SELECT %(org_id)s::text) AND finished_at IS NOT NULL
      AND finished_at > now() - interval '1 hour'
) AS e
GROUP BY 1;

-- name: unsettled_by_minute
-- Effects unsettled at the end of each of the last 60 minutes: claimed by then, not settled by
-- then (effects_recent for the hour's effects, effects_unsettled for older ones still open).
WITH candidates AS (
    SELECT created_at, settled_at FROM effects
    WHERE org_id = (SELECT %(org_id)s::text) AND created_at > now() - interval '1 hour'
    UNION ALL
    SELECT created_at, settled_at FROM effects
    WHERE org_id = (SELECT %(org_id)s::text) AND created_at <= now() - interval '1 hour'
      AND status IN ('in_flight', 'outcome_unknown')
)
SELECT m AS minutes_ago,
       (SELECT count(*) FROM candidates c
        WHERE c.created_at <= now() - m * interval '1 minute'
          AND (c.settled_at IS NULL OR c.settled_at > now() - m * interval '1 minute'))
           AS unsettled
FROM generate_series(0, 59) AS m;

-- name: outbox_lag_by_minute
-- Wake-ups published in the last hour (while the relay keeps sent rows): per minute, the
-- largest delay between due and published.
SELECT floor(extract(epoch FROM now() - sent_at) / 60)::int AS minutes_ago,
       max(extract(epoch FROM sent_at - deliver_at))::float8 AS worst_s
FROM outbox
WHERE org_id = (SELECT %(org_id)s::text) AND sent_at > now() - interval '1 hour'
GROUP BY 1;
