-- API keys (onward.api_keys): created, listed, revoked per organisation; authenticated by
-- key_id across organisations (api_keys_by_key_id).

-- name: insert
INSERT INTO api_keys (org_id, key_id, name, scopes, secret_hash, created_by)
VALUES (%(org_id)s, %(key_id)s, %(name)s, %(scopes)s, %(secret_hash)s, %(created_by)s)
RETURNING org_id, key_id, name, scopes, created_at, created_by, revoked_at, revoked_by,
          last_used_at;

-- name: list
SELECT key_id, name, scopes, created_at, created_by, revoked_at, revoked_by, last_used_at
FROM api_keys
WHERE org_id = (SELECT %(org_id)s::text)
ORDER BY created_at DESC, key_id;

-- name: revoke
-- Revoke a live key of this organisation (a revoked one stays as it was: no row).
UPDATE api_keys SET revoked_at = now(), revoked_by = %(by)s
WHERE org_id = (SELECT %(org_id)s::text) AND key_id = %(key_id)s AND revoked_at IS NULL
RETURNING key_id, name, scopes, created_at, created_by, revoked_at, revoked_by, last_used_at;

-- name: lookup
-- The one cross-organisation read: which organisation a presented key belongs to.
SELECT org_id, key_id, scopes, secret_hash, revoked_at
FROM api_keys
WHERE key_id = %(key_id)s;

-- name: touch
-- last_used_at, at most once a minute per key (one write a minute, not one per request).
UPDATE api_keys SET last_used_at = now()
WHERE org_id = (SELECT %(org_id)s::text) AND key_id = %(key_id)s
  AND (last_used_at IS NULL OR last_used_at < now() - interval '1 minute');
