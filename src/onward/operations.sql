-- Bulk operations over many runs (cancel by automation or filter, migrate a version). Each
-- batch's changes and the operation's progress commit together, so a crash leaves each run
-- either done or not and the operation resumes from after_run_id.

-- name: create
-- A new operation, leased to the process that drives it.
INSERT INTO operations (org_id, operation_id, kind, params, requested_by, lease_until)
VALUES (%(org_id)s, %(operation_id)s, %(kind)s, %(params)s, %(requested_by)s,
        now() + make_interval(secs => %(lease)s))
RETURNING *;

-- name: take
-- Lock a running operation for its next batch. Two drivers of one operation (a resumed one
-- whose first driver was only slow) take turns on this lock and each reads the cursor after
-- taking it, so no run is handled by two batches.
SELECT * FROM operations
WHERE org_id = (SELECT %(org_id)s::text) AND operation_id = %(operation_id)s AND status = 'running'
FOR UPDATE;

-- name: progress
-- After a batch, in its transaction: the cursor, the count, the outcomes by kind, the lease;
-- the pass (the next one starts from an empty cursor) and the runs deferred in it.
UPDATE operations
SET after_run_id = %(after_run_id)s, done = done + %(n)s,
    pass = pass + CASE WHEN %(next_pass)s THEN 1 ELSE 0 END, deferred = %(deferred)s,
    outcomes = (
        SELECT coalesce(jsonb_object_agg(k, v), '{}') FROM (
            SELECT k, sum(v::int) AS v FROM (
                SELECT key AS k, value AS v FROM jsonb_each_text(outcomes)
                UNION ALL
                SELECT key, value FROM jsonb_each_text(%(outcomes)s::jsonb)
            ) both_ GROUP BY k
        ) summed
    ),
    status = CASE WHEN %(finished)s THEN 'done' ELSE status END,
    finished_at = CASE WHEN %(finished)s THEN now() END,
    lease_until = now() + make_interval(secs => %(lease)s), updated_at = now()
WHERE org_id = (SELECT %(org_id)s::text) AND operation_id = %(operation_id)s
RETURNING *;

-- name: fail
-- The batch function refused the operation (its parameters no longer hold).
UPDATE operations SET status = 'failed', error = %(error)s, finished_at = now(), updated_at = now()
WHERE org_id = (SELECT %(org_id)s::text) AND operation_id = %(operation_id)s AND status = 'running'
RETURNING *;

-- name: get
-- One operation.
SELECT * FROM operations WHERE org_id = (SELECT %(org_id)s::text) AND operation_id = %(operation_id)s;

-- name: list
-- The newest operations first.
SELECT * FROM operations WHERE org_id = (SELECT %(org_id)s::text) ORDER BY created_at DESC LIMIT %(limit)s;

-- name: stale
-- Running operations whose driver stopped renewing the lease (it died): resume them.
SELECT org_id, operation_id, kind FROM operations
WHERE org_id = (SELECT %(org_id)s::text) AND status = 'running' AND lease_until < now()
ORDER BY lease_until LIMIT %(limit)s;

-- name: stale_orgs
-- The organisations that have an operation whose driver died (the elected sweeper's page).
-- A scan of the running operations only (operations_running is partial).
SELECT DISTINCT org_id FROM operations
WHERE status = 'running' AND lease_until < now()
ORDER BY org_id LIMIT %(limit)s;
