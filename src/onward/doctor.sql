-- The invariant queries (R16): watch for absence, not for errors. Zero rows / zero counts are
-- the only healthy answers, except where a threshold is named.

-- name: no_way_forward
-- Unfinished runs with no durable way forward: no unfinished step at all, or a waiting step
-- with no unfired timer (every wait -- on time, a signal or a person -- keeps a timer row for
-- its instant or its deadline). Running steps have a lease that lapses into a rescue; ready
-- steps are claimable; parked steps wait for the person shown on the parked list.
SELECT r.org_id, r.run_id, r.status, s.seq, s.status AS step_status, s.wait_kind
FROM runs r
LEFT JOIN LATERAL (  -- the run's latest step, its unfinished one if any (migration 0034)
    SELECT st.org_id, st.run_id, st.seq, st.status, st.wait_kind FROM steps st
    WHERE st.org_id = r.org_id AND st.run_id = r.run_id
    ORDER BY st.seq DESC LIMIT 1
) s ON s.status IN ('ready', 'running', 'waiting', 'parked')
WHERE r.finished_at IS NULL
  AND r.updated_at < now() - make_interval(secs => %(settle)s)
  AND (s.seq IS NULL
       OR (s.status = 'waiting' AND NOT EXISTS (
              SELECT 1 FROM timers t
              WHERE t.org_id = s.org_id AND t.run_id = s.run_id AND t.seq = s.seq
                AND t.fired_at IS NULL)))
ORDER BY r.updated_at
LIMIT %(limit)s;

-- name: overdue_timers
-- Timers the sweep should have fired by now: how many, and the oldest due instant.
SELECT count(*) AS overdue, min(due_at) AS oldest,
       extract(epoch FROM now() - min(due_at))::float8 AS oldest_age_s
FROM timers
WHERE fired_at IS NULL AND due_at < now() - make_interval(secs => %(grace)s);

-- name: stale_outbox
-- Wakes recorded but not published long after they were due: the relay is not running.
SELECT count(*) AS stale, min(deliver_at) AS oldest
FROM outbox
WHERE sent_at IS NULL AND deliver_at < now() - make_interval(secs => %(grace)s);

-- name: expired_leases
-- Claimed steps whose lease lapsed long ago and were not rescued: the sweeper is not running.
SELECT count(*) AS expired, min(lease_until) AS oldest
FROM steps
WHERE status = 'running' AND lease_until < now() - make_interval(secs => %(grace)s);

-- name: two_unfinished
-- Running steps that are not their run's only unfinished step: another step of the run is
-- unfinished, or a later step exists at all. steps_one_unfinished refuses two ready, waiting
-- or parked steps of a run; a running step is left out of it (migration 0034) because its
-- successor is written only by the statement that ends it. Read from the steps in flight
-- (steps_leased), each with its run's steps by steps_pkey (a lateral with a LIMIT: never the
-- organisation's every waiting step hashed); the healthy answer is zero.
SELECT count(*) AS runs, min(s.org_id || '/' || s.run_id) AS example
FROM steps s
CROSS JOIN LATERAL (
    SELECT 1 FROM steps o
    WHERE o.org_id = s.org_id AND o.run_id = s.run_id AND o.seq <> s.seq
      AND (o.seq > s.seq OR o.status IN ('ready', 'running', 'waiting', 'parked'))
    LIMIT 1
) other
WHERE s.status = 'running';

-- name: unsettled_effects
-- Effects claimed but neither settled nor parked for a person for longer than the grace
-- period: their step's lease, reconciliation or retry should have moved them by now.
SELECT count(*) AS unsettled, min(first_attempt_at) AS oldest
FROM effects
WHERE status IN ('in_flight', 'outcome_unknown')
  AND coalesce(last_attempt_at, created_at) < now() - make_interval(secs => %(grace)s);

-- name: effects_in_review
-- Effects whose outcome nobody can know (a provider that cannot be searched): parked for a
-- person by design (``NeedsReview``), with their run, until someone resolves the review.
SELECT count(*) AS in_review, min(first_attempt_at) AS oldest
FROM effects
WHERE status = 'review';

-- name: sweeper_leader
-- Is a sweeper elected right now?
SELECT holder, term, lease_until, lease_until > now() AS live
FROM leader_leases WHERE org_id = '_system' AND name = 'sweeper';

-- name: lanes
-- Per lane (R18): ready steps and the age of the oldest one that is claimable now (a starved
-- lane shows here first), running steps (slots in use across every worker), and steps parked
-- on a circuit or a budget. The statuses as ORs, each its own partial index (steps_claimable,
-- steps_leased, steps_parked) in one bitmap: as an IN list no index's predicate matches it
-- (a running step is in no steps_one_unfinished entry: migration 0034), and the plan read
-- every step.
SELECT lane,
       count(*) FILTER (WHERE status = 'ready' AND available_at <= now()) AS ready,
       coalesce(extract(epoch FROM now() - min(available_at)
                FILTER (WHERE status = 'ready' AND available_at <= now())), 0)::float8
           AS oldest_ready_s,
       count(*) FILTER (WHERE status = 'running') AS running,
       count(*) FILTER (WHERE status = 'parked' AND wait_kind = 'circuit') AS parked_circuit,
       count(*) FILTER (WHERE status = 'parked' AND wait_kind = 'budget') AS parked_budget
FROM steps
WHERE status = 'ready' OR status = 'running' OR status = 'parked'
GROUP BY lane
ORDER BY lane;

-- name: table_sizes
-- Every table of onward's schema: its size on disk with indexes and TOAST, and its row count
-- as PostgreSQL estimates it (pg_class.reltuples, as of the last VACUUM or ANALYZE), largest
-- first. Retention is what keeps runs, steps and history from growing without end.
SELECT c.relname AS table_name, pg_total_relation_size(c.oid) AS bytes,
       greatest(c.reltuples, 0)::bigint AS rows
FROM pg_class c
JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE c.relkind IN ('r', 'p') AND n.nspname = current_schema()
ORDER BY bytes DESC, table_name;
