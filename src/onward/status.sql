-- What `onward status` reads: what runs right now, seen from the database. There is no registry
-- of worker processes; the leader leases and the step leases held are what shows them.

-- name: leaders
-- Every elected singleton (the sweeper, ...) and whether its lease is still live.
SELECT org_id, name, holder, term, lease_until, lease_until > now() AS live
FROM leader_leases
ORDER BY org_id, name;

-- name: step_holders
-- The processes holding step leases now, per lane (steps_leased: running steps only).
SELECT owner AS worker, lane, count(*) AS steps, max(lease_until) AS lease_until
FROM steps
WHERE status = 'running'
GROUP BY owner, lane
ORDER BY owner, lane;

-- name: unsent_wakes
-- Outbox rows not yet published to the queue (outbox_unsent), and how many are due now.
SELECT count(*) AS unsent, count(*) FILTER (WHERE deliver_at <= now()) AS due
FROM outbox
WHERE sent_at IS NULL;
