-- Leader election for singletons (the sweeper) by a short renewable lease row.

-- name: acquire
-- Take or renew the lease: succeeds if nobody holds it, it lapsed, or we already hold it.
-- term grows on every change of holder: a fencing token for the leadership.
INSERT INTO leader_leases (name, holder, term, lease_until)
VALUES (%(name)s, %(holder)s, 1, now() + make_interval(secs => %(ttl)s))
ON CONFLICT (org_id, name) DO UPDATE
SET holder = EXCLUDED.holder,
    term = CASE WHEN leader_leases.holder = EXCLUDED.holder THEN leader_leases.term
                ELSE leader_leases.term + 1 END,
    lease_until = EXCLUDED.lease_until
WHERE leader_leases.holder = EXCLUDED.holder OR leader_leases.lease_until < now()
RETURNING term;

-- name: resign
-- Give the lease up at shutdown so another process takes over at once.
UPDATE leader_leases SET lease_until = now()
WHERE org_id = '_system' AND name = %(name)s AND holder = %(holder)s;
