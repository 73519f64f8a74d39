-- Notifications that arrive (R15). A transition that must tell the customer something writes a
-- `notifications` row (since 0002) and, in the same statement, one delivery intent per
-- destination the organisation has configured (`fragments.sql notify`). A delivery relay in
-- every worker process claims due intents with a short lease, sends them with no transaction
-- open, and writes the outcome; the receiver deduplicates by the notification id it is sent.

-- Where an organisation's notifications go: a webhook (signed as Standard Webhooks sign), or a
-- Slack channel / an email address through one of its connections.
CREATE TABLE notification_destinations (
    org_id         text NOT NULL,
    destination_id text NOT NULL,
    kind           text NOT NULL CHECK (kind IN ('webhook', 'slack', 'email')),
    url            text,        -- webhook: where to POST
    secret         text,        -- webhook: the signing secret (whsec_<base64>)
    connection_id  text,        -- slack / email: the connection that sends it
    target         text,        -- slack: the channel; email: the address
    created_at     timestamptz NOT NULL DEFAULT now(),
    updated_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (org_id, destination_id),
    CHECK (kind <> 'webhook' OR (url IS NOT NULL AND secret IS NOT NULL)),
    CHECK (kind = 'webhook' OR (connection_id IS NOT NULL AND target IS NOT NULL))
);

-- One notification to one destination: the durable intent, and its delivery state.
--   pending    due at next_attempt_at; a relay that claims it pushes next_attempt_at one lease
--              ahead and counts the attempt (its fencing token), so a relay that dies mid-send
--              leaves it due again when the lease lapses
--   delivered  the destination answered 2xx (delivered_at)
--   failed     max attempts spent; `onward notifications retry` makes it pending again
CREATE TABLE notification_deliveries (
    org_id          text NOT NULL,
    notification_id bigint NOT NULL,
    destination_id  text NOT NULL,
    status          text NOT NULL DEFAULT 'pending'
                    CHECK (status IN ('pending', 'delivered', 'failed')),
    attempts        integer NOT NULL DEFAULT 0,
    retried_after   integer NOT NULL DEFAULT 0,  -- attempts spent before the last manual retry
    next_attempt_at timestamptz NOT NULL DEFAULT now(),
    claimed_by      text,
    last_status     integer,                     -- HTTP status of the last answer, if any
    last_error      text,
    created_at      timestamptz NOT NULL DEFAULT now(),
    delivered_at    timestamptz,
    PRIMARY KEY (org_id, notification_id, destination_id)
);

-- The relay's claim scans pending intents across organisations (like outbox_unsent).
CREATE INDEX notification_deliveries_due ON notification_deliveries (next_attempt_at)
    WHERE status = 'pending';

-- Intents that gave up, for the doctor and an operator's retry.
CREATE INDEX notification_deliveries_failed ON notification_deliveries (org_id, notification_id)
    WHERE status = 'failed';

-- Undelivered notifications per organisation, oldest first (doctor, `notifications list`).
CREATE INDEX notifications_undelivered ON notifications (org_id, created_at)
    WHERE delivered_at IS NULL;
