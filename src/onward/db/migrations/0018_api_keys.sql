-- API keys (issue 14, Build 1): who may call the HTTP API, for which organisation, with which
-- scopes. The key itself is shown once, when it is created, and never stored: ``secret_hash``
-- is the SHA-256 of the whole key (the key holds 256 random bits, so a plain hash is enough:
-- nothing to guess from it). A key names its ``key_id`` in clear (``onw_<key_id>_<secret>``),
-- so authenticating is one lookup by ``key_id`` -- across organisations, because the request
-- says no organisation before its key is known: hence the unique index on ``key_id`` alone.
-- Revoking sets ``revoked_at``; a revoked key authenticates nothing from that commit on. Rows
-- are never deleted (the audit names key ids).
CREATE TABLE api_keys (
    org_id       text NOT NULL,
    key_id       text NOT NULL,
    name         text NOT NULL,
    scopes       text[] NOT NULL,
    secret_hash  bytea NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    created_by   text NOT NULL,
    revoked_at   timestamptz,
    revoked_by   text,
    last_used_at timestamptz,
    PRIMARY KEY (org_id, key_id),
    CONSTRAINT api_keys_scopes CHECK (
        cardinality(scopes) > 0
        AND scopes <@ ARRAY['runs:read', 'runs:write', 'automations:write', 'admin']::text[]
    ),
    CONSTRAINT api_keys_hash CHECK (octet_length(secret_hash) = 32)
);
CREATE UNIQUE INDEX api_keys_by_key_id ON api_keys (key_id);
