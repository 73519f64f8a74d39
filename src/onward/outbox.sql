-- The transactional outbox (R2): rows are written by the transition they announce (start.sql,
-- leases.sql, timers.sql); the relay publishes and marks them sent.

-- name: take_unsent
-- Lock a batch of unsent rows due within %(horizon)s seconds (0 for a queue without delayed
-- jobs; the delay is then kept here until deliver_at). SKIP LOCKED: several relays share work.
SELECT org_id, outbox_id, topic, job_id, lane, payload,
       greatest(0, extract(epoch FROM deliver_at - now()))::float8 AS delay_s
FROM outbox
WHERE sent_at IS NULL AND deliver_at <= now() + make_interval(secs => %(horizon)s)
ORDER BY deliver_at, outbox_id
LIMIT %(limit)s
FOR UPDATE SKIP LOCKED;

-- name: next_due
-- Seconds until the earliest unsent row not yet due comes due (NULL: none), for a queue without
-- delayed jobs: the relay sleeps until then instead of a whole poll interval, so a timer's wake
-- leaves at its instant. Served by outbox_unsent: its first entry after now().
SELECT extract(epoch FROM min(deliver_at) - now())::float8 AS wait_s
FROM outbox
WHERE sent_at IS NULL AND deliver_at > now();

-- name: mark_sent
-- After publishing: a crash before this line republishes the batch (deduplicated by job id).
UPDATE outbox o SET sent_at = now()
FROM unnest(%(org_ids)s::text[], %(outbox_ids)s::bigint[]) AS x(org_id, outbox_id)
WHERE o.org_id = x.org_id AND o.outbox_id = x.outbox_id;

-- name: prune_sent
-- Sent rows are kept a while for inspection, then removed in bounded batches.
DELETE FROM outbox WHERE (org_id, outbox_id) IN (
    SELECT org_id, outbox_id FROM outbox
    WHERE sent_at IS NOT NULL AND sent_at < now() - make_interval(secs => %(keep)s)
    LIMIT %(limit)s
);
