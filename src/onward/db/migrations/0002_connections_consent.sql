-- 0002: connected accounts (R15) and consent / suppression (R14).

-- One row per connected account. A broken connection parks every run that needs it until a
-- person reconnects; restoring it resumes them from the same step.
CREATE TABLE connections (
    org_id        text NOT NULL,
    connection_id text NOT NULL,
    provider      text NOT NULL,
    base_url      text NOT NULL,
    account       text NOT NULL,
    secret        text NOT NULL,              -- the credential (a token); never shown by the API
    status        text NOT NULL DEFAULT 'ok' CHECK (status IN (
        'ok',       -- usable
        'broken'    -- the provider refused its credentials; runs needing it are parked
    )),
    broken_reason text,
    broken_at     timestamptz,
    checked_at    timestamptz,                -- last health probe
    updated_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (org_id, connection_id)
);

-- Who must not be contacted, checked at the moment an effect that contacts a person runs.
CREATE TABLE suppressions (
    org_id     text NOT NULL,
    contact    text NOT NULL,                 -- e.g. an email address, lower-cased
    channel    text NOT NULL DEFAULT 'email',
    reason     text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (org_id, contact, channel)
);

-- Messages for the customer ("reconnect the mailbox"), written durably by the transition that
-- needs them; a notification hook delivers them.
CREATE TABLE notifications (
    org_id          text NOT NULL,
    notification_id bigint GENERATED ALWAYS AS IDENTITY,
    kind            text NOT NULL,
    subject         text NOT NULL,
    body            jsonb NOT NULL DEFAULT '{}',
    created_at      timestamptz NOT NULL DEFAULT now(),
    delivered_at    timestamptz,
    PRIMARY KEY (org_id, notification_id)
);

CREATE INDEX steps_parked ON steps (org_id, wait_kind) WHERE status = 'parked';
