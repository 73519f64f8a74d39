-- Signed intake (issue 14, B3): webhook secrets per automation and the per-organisation intake
-- rate window. Only onward.intake runs these.

-- name: store_secret
-- Add one secret to an automation's webhook endpoint (the others stay valid: rotation).
INSERT INTO hook_secrets (org_id, automation_id, secret_id, secret)
VALUES (%(org_id)s, %(automation_id)s, %(secret_id)s, %(secret)s)
RETURNING secret_id, created_at;

-- name: load_secrets
-- Every secret of an automation's webhook endpoint, oldest first (with the secret itself).
SELECT secret_id, secret, created_at
FROM hook_secrets
WHERE org_id = (SELECT %(org_id)s::text) AND automation_id = %(automation_id)s
ORDER BY created_at, secret_id;

-- name: list_secrets
-- The organisation's webhook secrets without the secret itself (ids and when made).
SELECT automation_id, secret_id, created_at
FROM hook_secrets
WHERE org_id = (SELECT %(org_id)s::text)
  AND (%(automation_id)s::text IS NULL OR automation_id = %(automation_id)s)
ORDER BY automation_id, created_at, secret_id;

-- name: remove_secret
-- Remove one secret: requests signed with it are refused from now on.
DELETE FROM hook_secrets
WHERE org_id = (SELECT %(org_id)s::text) AND automation_id = %(automation_id)s AND secret_id = %(secret_id)s
RETURNING secret_id;

-- name: count_request
-- Count n intake requests (one, or those intake.Admitter gathered) in the organisation's
-- current fixed window (database time); answer the count with them and the seconds left in the
-- window. Windows before the previous one are deleted.
WITH win AS (
    SELECT to_timestamp(floor(extract(epoch FROM now()) / %(window_s)s) * %(window_s)s) AS start
),
gone AS (
    DELETE FROM intake_windows
    WHERE org_id = (SELECT %(org_id)s::text)
      AND window_start < (SELECT start FROM win) - make_interval(secs => %(window_s)s)
)
INSERT INTO intake_windows AS w (org_id, window_start, requests)
SELECT %(org_id)s, start, %(n)s FROM win
ON CONFLICT (org_id, window_start) DO UPDATE SET requests = w.requests + %(n)s
RETURNING requests,
          extract(epoch FROM w.window_start + make_interval(secs => %(window_s)s) - now())::float8
              AS seconds_left;

-- name: secrets_batch
-- onward keys rotate-secrets: the next page of webhook secrets of every organisation, by key.
SELECT org_id, automation_id, secret_id, secret FROM hook_secrets
WHERE (org_id, automation_id, secret_id) > (%(after_org)s, %(after_automation)s, %(after_id)s)
ORDER BY org_id, automation_id, secret_id
LIMIT %(limit)s;

-- name: update_secret
-- onward keys rotate-secrets: the same secret, encrypted under the current key.
UPDATE hook_secrets SET secret = %(secret)s
WHERE org_id = (SELECT %(org_id)s::text) AND automation_id = %(automation_id)s AND secret_id = %(secret_id)s;
