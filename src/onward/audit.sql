-- Audit: who changed what in an organisation, and when (onward.audit). A row is written in
-- the same transaction as the change it records; nothing ever updates or deletes one.

-- name: record
-- One audit row, in the caller's transaction (the change it records commits with it).
INSERT INTO audit (org_id, actor, action, target, detail)
VALUES (%(org_id)s, %(actor)s, %(action)s, %(target)s, %(detail)s)
RETURNING audit_id;

-- name: page
-- An organisation's audit rows, newest first, before a keyset cursor (audit_id), optionally
-- of one action and since an instant.
SELECT audit_id, at, actor, action, target, detail FROM audit
WHERE org_id = (SELECT %(org_id)s::text)
  AND audit_id < %(before)s
  AND (%(action)s::text IS NULL OR action = %(action)s::text)
  AND (%(since)s::timestamptz IS NULL OR at >= %(since)s::timestamptz)
ORDER BY audit_id DESC
LIMIT %(limit)s;
