-- Secrets at rest (onward.vault): the key the database keeps for itself when no
-- ONWARD_SECRET_KEYS is configured, and the engine_secrets side of rotate-secrets.

-- name: local_key
-- The database's own encryption key, if it has one.
SELECT secret FROM engine_secrets WHERE org_id = '_system' AND name = %(name)s;

-- name: make_local_key
-- Make the database's own key (a concurrent maker's row wins; this then returns nothing).
INSERT INTO engine_secrets (org_id, name, secret) VALUES ('_system', %(name)s, %(secret)s)
ON CONFLICT (org_id, name) DO NOTHING
RETURNING secret;

-- name: engine_secrets_batch
-- The next batch of engine secrets to re-encrypt, in key order after the cursor, locked for
-- the batch's transaction (the database's own key is skipped: it is the key, not a secret).
SELECT org_id, name, secret FROM engine_secrets
WHERE (org_id, name) > (%(after_org)s, %(after_name)s)
  AND NOT (org_id = '_system' AND name = %(skip)s)
ORDER BY org_id, name
LIMIT %(limit)s
FOR UPDATE;

-- name: update_engine_secret
-- Store an engine secret re-encrypted under the current key.
UPDATE engine_secrets SET secret = %(secret)s
WHERE org_id = (SELECT %(org_id)s::text) AND name = %(name)s;

-- name: not_current
-- How many stored secrets (every encrypted column) are not under the current key: plain
-- values written before encryption, or values under an older key. Read by onward doctor.
SELECT (SELECT count(*) FROM connections
        WHERE secret NOT LIKE %(prefix)s
           OR (signing_secret IS NOT NULL AND signing_secret NOT LIKE %(prefix)s))
     + (SELECT count(*) FROM notification_destinations
        WHERE secret IS NOT NULL AND secret NOT LIKE %(prefix)s)
     + (SELECT count(*) FROM hook_secrets WHERE secret NOT LIKE %(prefix)s)
     + (SELECT count(*) FROM engine_secrets
        WHERE secret NOT LIKE %(prefix)s AND NOT (org_id = '_system' AND name = %(skip)s))
       AS n;
