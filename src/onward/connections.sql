-- Connected accounts (R15).

-- name: upsert
-- Create a connection or replace its credentials. A broken connection stays broken, and its
-- parked runs stay parked, until restore (the customer says the new credentials work).
INSERT INTO connections (org_id, connection_id, provider, base_url, account, secret,
                         signing_secret)
VALUES (%(org_id)s, %(connection_id)s, %(provider)s, %(base_url)s, %(account)s, %(secret)s,
        %(signing_secret)s)
ON CONFLICT (org_id, connection_id) DO UPDATE
SET provider = EXCLUDED.provider, base_url = EXCLUDED.base_url, account = EXCLUDED.account,
    secret = EXCLUDED.secret, signing_secret = EXCLUDED.signing_secret, updated_at = now()
RETURNING connection_id;

-- name: get
-- One connection. ``updated_at`` says which state of it a caller read (mark_broken's seen_at).
SELECT connection_id, provider, base_url, account, secret, status, broken_reason,
       signing_secret, updated_at
FROM connections WHERE org_id = (SELECT %(org_id)s::text) AND connection_id = %(connection_id)s;

-- name: mark_broken
-- The provider refused the credentials: mark broken and write the customer's notification with
-- its delivery intents in the same statement (only on the change, so a hundred parked runs
-- notify once). seen_at: the connection's updated_at when the refused call read it; a
-- connection restored (or given new credentials) since then is not broken again by a refusal
-- of what it was before (NULL: no such condition).
WITH b AS (
    UPDATE connections SET status = 'broken', broken_reason = %(reason)s, broken_at = now(),
                           updated_at = now()
    WHERE org_id = (SELECT %(org_id)s::text) AND connection_id = %(connection_id)s AND status = 'ok'
      AND (%(seen_at)s::timestamptz IS NULL OR updated_at = %(seen_at)s::timestamptz)
    RETURNING org_id, connection_id, provider, account
),
to_notify AS (
    SELECT org_id, 'connection_broken' AS kind,
           'reconnect the ' || provider || ' account ' || account AS subject,
           jsonb_build_object('connection_id', connection_id, 'reason', %(reason)s::text) AS body
    FROM b
),
{{notify}}
SELECT notification_id, subject FROM noted;

-- name: restore
-- The customer reconnected: the connection is usable again. Its own statement, first in the
-- transaction: it takes the row lock a step parking on this connection waits for
-- (lock_for_park), so resume_parked, a later statement with a later snapshot, sees every step
-- parked before it.
UPDATE connections SET status = 'ok', broken_reason = NULL, updated_at = now()
WHERE org_id = (SELECT %(org_id)s::text) AND connection_id = %(connection_id)s
RETURNING org_id, connection_id;

-- name: resume_parked
-- Every step parked on the restored connection becomes ready (same step, next attempt) with a
-- wake, in restore's transaction.
WITH to_ready AS (
    SELECT st.org_id, st.run_id, st.seq, 'parked' AS from_status, NULL::int AS attempt,
           now() AS available_at,
           jsonb_build_object('by', 'reconnect', 'connection_id', %(connection_id)s::text) AS wake,
           NULL::jsonb AS error, 'step_resumed' AS event, NULL::text AS worker,
           jsonb_build_object('by', 'reconnect', 'connection_id', %(connection_id)s::text) AS detail
    FROM steps st
    WHERE st.org_id = (SELECT %(org_id)s::text) AND st.status = 'parked' AND st.wait_kind = 'reconnect'
      AND st.error ->> 'connection' = %(connection_id)s
),
{{make_ready}},
r AS (
    UPDATE runs SET status = 'active', status_reason = NULL, updated_at = now()
    FROM ready
    WHERE runs.org_id = ready.org_id AND runs.run_id = ready.run_id
      AND runs.status = ready.from_status
)
SELECT run_id, seq FROM ready;

-- name: lock_for_park
-- A step is about to park on this connection (its credentials were refused): read its status
-- under a share lock. A restore that committed first is seen (the step goes on instead of
-- parking); a restore that comes later waits for the park to commit, then resumes it.
SELECT status FROM connections
WHERE org_id = (SELECT %(org_id)s::text) AND connection_id = %(connection_id)s
FOR SHARE;

-- name: mark_checked
-- A health probe answered.
UPDATE connections SET checked_at = now()
WHERE org_id = (SELECT %(org_id)s::text) AND connection_id = %(connection_id)s
RETURNING connection_id;

-- name: suppress
-- Add a contact to the suppression list (unsubscribe, complaint, erasure).
INSERT INTO suppressions (org_id, contact, channel, reason)
VALUES (%(org_id)s, lower(%(contact)s), %(channel)s, %(reason)s)
ON CONFLICT (org_id, contact, channel) DO UPDATE SET reason = EXCLUDED.reason
RETURNING contact;

-- name: suppression
-- Why a contact must not be contacted on a channel, if they must not: listed in clear text, or
-- by its pseudonym (an erased contact, onward.pseudonyms).
SELECT reason, created_at, contact LIKE 'hmac-sha256:%%' AS pseudonymous FROM suppressions
WHERE org_id = (SELECT %(org_id)s::text) AND contact IN (lower(%(contact)s), %(pseudonym)s)
  AND channel = %(channel)s
ORDER BY pseudonymous
LIMIT 1;

-- name: pseudonymise
-- Erasure: the contact's clear-text suppressions (any channel) are replaced by its pseudonyms,
-- on email and on every channel it was suppressed on; no address is left in the list.
WITH gone AS (
    DELETE FROM suppressions
    WHERE org_id = (SELECT %(org_id)s::text) AND contact = ANY(%(contacts)s::text[])
    RETURNING channel
),
channels AS (
    SELECT 'email' AS channel UNION SELECT channel FROM gone
),
added AS (
    INSERT INTO suppressions (org_id, contact, channel, reason)
    SELECT %(org_id)s, d.digest, c.channel, %(reason)s
    FROM unnest(%(digests)s::text[]) AS d(digest) CROSS JOIN channels c
    ON CONFLICT (org_id, contact, channel) DO NOTHING
    RETURNING contact
)
SELECT (SELECT count(*) FROM gone) AS forgotten, (SELECT count(*) FROM added) AS added;

-- name: secrets_batch
-- onward keys rotate-secrets: the next batch of connections after the cursor, in key order,
-- locked for the batch's transaction.
SELECT org_id, connection_id, secret, signing_secret FROM connections
WHERE (org_id, connection_id) > (%(after_org)s, %(after_id)s)
ORDER BY org_id, connection_id
LIMIT %(limit)s
FOR UPDATE;

-- name: update_secrets
-- Store a connection's secrets re-encrypted under the current key (no other column changes).
UPDATE connections SET secret = %(secret)s, signing_secret = %(signing_secret)s
WHERE org_id = (SELECT %(org_id)s::text) AND connection_id = %(connection_id)s;
