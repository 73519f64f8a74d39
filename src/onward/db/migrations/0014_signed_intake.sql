-- Signed intake (issue 14, B3): the Standard Webhooks secrets of each automation's webhook
-- endpoint (`POST /v1/hooks/{automation_id}`), and the fixed windows that rate-limit intake per
-- organisation. Read and written only by onward.intake.

-- An endpoint with at least one row requires a signature that holds under one of them (several
-- rows at once: rotation). An endpoint with none takes unsigned requests, as before.
-- `secret` is `whsec_<base64>`; onward.intake reads and writes it in one place
-- (`_store_secret` / `_load_secrets`) so it can be encrypted at rest there.
CREATE TABLE hook_secrets (
    org_id        text NOT NULL,
    automation_id text NOT NULL,
    secret_id     text NOT NULL,
    secret        text NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (org_id, automation_id, secret_id)
);

-- Requests to the intake of one organisation in one fixed window (onward.intake.admit): over
-- the limit, 429 with Retry-After until the window ends. Windows older than the previous one
-- are deleted by the statement that counts.
CREATE TABLE intake_windows (
    org_id       text NOT NULL,
    window_start timestamptz NOT NULL,
    requests     integer NOT NULL,
    PRIMARY KEY (org_id, window_start)
);
