-- Notifications that arrive (R15): destinations, delivery intents, the delivery relay. The
-- notifications and their intents are written by the transition that needs them, through
-- `fragments.sql notify` (today `connections.sql mark_broken`).

-- name: set_destination
-- Create or replace a destination; every notification of the organisation still undelivered
-- gets an intent for it (a destination added after a notification was written still gets it).
WITH d AS (
    INSERT INTO notification_destinations (org_id, destination_id, kind, url, secret,
                                           connection_id, target)
    VALUES (%(org_id)s, %(destination_id)s, %(kind)s, %(url)s, %(secret)s,
            %(connection_id)s, %(target)s)
    ON CONFLICT (org_id, destination_id) DO UPDATE
    SET kind = EXCLUDED.kind, url = EXCLUDED.url, secret = EXCLUDED.secret,
        connection_id = EXCLUDED.connection_id, target = EXCLUDED.target, updated_at = now()
    RETURNING org_id, destination_id, kind, url, secret, connection_id, target, created_at,
              updated_at
),
backlog AS (
    INSERT INTO notification_deliveries (org_id, notification_id, destination_id)
    SELECT n.org_id, n.notification_id, d.destination_id
    FROM d JOIN notifications n ON n.org_id = d.org_id AND n.delivered_at IS NULL
    ON CONFLICT DO NOTHING
    RETURNING notification_id
)
SELECT d.*, (SELECT count(*) FROM backlog) AS backlog FROM d;

-- name: destinations
-- The organisation's destinations (the secret only says whether there is one).
SELECT destination_id, kind, url, connection_id, target, secret IS NOT NULL AS signed,
       created_at, updated_at
FROM notification_destinations
WHERE org_id = (SELECT %(org_id)s::text)
ORDER BY destination_id;

-- name: remove_destination
-- Remove a destination and the intents it had not received yet; returns the notifications
-- those intents belonged to (`complete` then decides whether they are now delivered).
WITH d AS (
    DELETE FROM notification_destinations
    WHERE org_id = (SELECT %(org_id)s::text) AND destination_id = %(destination_id)s
    RETURNING org_id, destination_id
),
gone AS (
    DELETE FROM notification_deliveries x USING d
    WHERE x.org_id = d.org_id AND x.destination_id = d.destination_id
      AND x.status <> 'delivered'
    RETURNING x.notification_id
)
SELECT (SELECT count(*) FROM d) AS removed,
       coalesce((SELECT array_agg(DISTINCT notification_id) FROM gone), '{}') AS notification_ids;

-- name: claim
-- The relay takes due intents (SKIP LOCKED: relays share the work) and commits at once: the
-- attempt is counted (its fencing token) and the intent is pushed one lease ahead, so it is due
-- again only if this relay dies before writing the outcome. No transaction stays open while
-- the relay sends.
WITH due AS (
    SELECT org_id, notification_id, destination_id
    FROM notification_deliveries
    WHERE status = 'pending' AND next_attempt_at <= now()
    ORDER BY next_attempt_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
UPDATE notification_deliveries x
SET attempts = x.attempts + 1, claimed_by = %(worker)s,
    next_attempt_at = now() + make_interval(secs => %(lease)s)
FROM due, notifications n, notification_destinations dst
WHERE x.org_id = due.org_id AND x.notification_id = due.notification_id
  AND x.destination_id = due.destination_id
  AND n.org_id = x.org_id AND n.notification_id = x.notification_id
  AND dst.org_id = x.org_id AND dst.destination_id = x.destination_id
RETURNING x.org_id, x.notification_id, x.destination_id, x.attempts,
          x.attempts - x.retried_after AS attempts_in_round,
          n.kind, n.subject, n.body, n.created_at,
          dst.kind AS via, dst.url, dst.secret, dst.connection_id, dst.target,
          extract(epoch FROM now())::bigint AS now_epoch;

-- name: lock_notifications
-- Settling an intent first locks its notification, so two destinations of one notification
-- settling at once see each other's outcome (whoever comes second writes delivered_at).
SELECT notification_id FROM notifications
WHERE org_id = (SELECT %(org_id)s::text) AND notification_id = ANY(%(notification_ids)s)
ORDER BY notification_id
FOR UPDATE;

-- name: delivered
-- The destination answered 2xx: the intent is delivered, if this attempt still holds it (the
-- fence: a relay whose lease lapsed and was claimed again writes nothing).
UPDATE notification_deliveries
SET status = 'delivered', delivered_at = now(), claimed_by = NULL,
    last_status = %(http_status)s, last_error = NULL
WHERE org_id = (SELECT %(org_id)s::text) AND notification_id = %(notification_id)s
  AND destination_id = %(destination_id)s AND attempts = %(attempt)s AND status = 'pending'
RETURNING notification_id;

-- name: complete
-- Notifications whose every intent is delivered (at least one) become delivered.
UPDATE notifications n SET delivered_at = now()
WHERE n.org_id = (SELECT %(org_id)s::text) AND n.notification_id = ANY(%(notification_ids)s)
  AND n.delivered_at IS NULL
  AND EXISTS (SELECT 1 FROM notification_deliveries x
              WHERE x.org_id = n.org_id AND x.notification_id = n.notification_id)
  AND NOT EXISTS (SELECT 1 FROM notification_deliveries x
                  WHERE x.org_id = n.org_id AND x.notification_id = n.notification_id
                    AND x.status <> 'delivered')
RETURNING notification_id;

-- name: attempt_failed
-- Not delivered: due again after the backoff delay, or failed once the round's attempts are
-- spent. Fenced by the attempt like `delivered`.
UPDATE notification_deliveries
SET status = CASE WHEN attempts - retried_after >= %(max_attempts)s THEN 'failed'
                  ELSE 'pending' END,
    next_attempt_at = now() + make_interval(secs => %(delay)s), claimed_by = NULL,
    last_status = %(http_status)s, last_error = %(error)s
WHERE org_id = (SELECT %(org_id)s::text) AND notification_id = %(notification_id)s
  AND destination_id = %(destination_id)s AND attempts = %(attempt)s AND status = 'pending'
RETURNING status, next_attempt_at;

-- name: retry
-- An operator's retry: failed intents, and pending ones waiting out a backoff (not one a live
-- relay holds), of one notification or of every undelivered one, are due now with a new round
-- of attempts.
UPDATE notification_deliveries
SET status = 'pending', next_attempt_at = now(), retried_after = attempts
WHERE org_id = (SELECT %(org_id)s::text)
  AND (%(notification_id)s::bigint IS NULL OR notification_id = %(notification_id)s::bigint)
  AND (status = 'failed'
       OR (status = 'pending' AND (claimed_by IS NULL OR next_attempt_at <= now())))
RETURNING notification_id, destination_id;

-- name: exists
-- Is there such a notification in the organisation?
SELECT 1 AS found FROM notifications
WHERE org_id = (SELECT %(org_id)s::text) AND notification_id = %(notification_id)s;

-- name: list
-- The organisation's notifications, newest first, each with its deliveries.
SELECT n.notification_id, n.kind, n.subject, n.body, n.created_at, n.delivered_at,
       coalesce((SELECT jsonb_agg(jsonb_build_object(
                     'destination_id', x.destination_id, 'status', x.status,
                     'attempts', x.attempts, 'next_attempt_at', x.next_attempt_at,
                     'last_status', x.last_status, 'last_error', x.last_error,
                     'delivered_at', x.delivered_at) ORDER BY x.destination_id)
                 FROM notification_deliveries x
                 WHERE x.org_id = n.org_id AND x.notification_id = n.notification_id),
                '[]'::jsonb) AS deliveries
FROM notifications n
WHERE n.org_id = (SELECT %(org_id)s::text) AND (NOT %(undelivered)s OR n.delivered_at IS NULL)
ORDER BY n.notification_id DESC
LIMIT %(limit)s;

-- name: undelivered
-- Notifications still undelivered `grace` seconds after they were written, across every
-- organisation (`onward doctor`): how many, the oldest, how many have no destination at all,
-- and how many intents gave up (failed).
SELECT count(*) AS undelivered, min(n.created_at) AS oldest,
       count(*) FILTER (WHERE NOT EXISTS (
           SELECT 1 FROM notification_deliveries x
           WHERE x.org_id = n.org_id AND x.notification_id = n.notification_id))
           AS no_destination,
       (SELECT count(*) FROM notification_deliveries WHERE status = 'failed') AS failed
FROM notifications n
WHERE n.delivered_at IS NULL AND n.created_at < now() - make_interval(secs => %(grace)s);

-- name: prune_delivered
-- Delivered notifications are kept `keep` seconds for inspection, then removed with their
-- intents, in bounded batches (the elected sweeper, with the outbox's pruning).
WITH old AS (
    SELECT org_id, notification_id FROM notifications
    WHERE delivered_at < now() - make_interval(secs => %(keep)s)
    LIMIT %(limit)s
),
intents AS (
    DELETE FROM notification_deliveries x USING old
    WHERE x.org_id = old.org_id AND x.notification_id = old.notification_id
)
DELETE FROM notifications n USING old
WHERE n.org_id = old.org_id AND n.notification_id = old.notification_id;

-- name: secrets_batch
-- onward keys rotate-secrets: the next batch of destinations with a secret after the cursor,
-- in key order, locked for the batch's transaction.
SELECT org_id, destination_id, secret FROM notification_destinations
WHERE (org_id, destination_id) > (%(after_org)s, %(after_id)s) AND secret IS NOT NULL
ORDER BY org_id, destination_id
LIMIT %(limit)s
FOR UPDATE;

-- name: update_secret
-- Store a destination's secret re-encrypted under the current key (nothing else changes).
UPDATE notification_destinations SET secret = %(secret)s
WHERE org_id = (SELECT %(org_id)s::text) AND destination_id = %(destination_id)s;
