-- Outbound safety (issue 14, item 5): the addresses an organisation's user-configured HTTP
-- (http.call connections, provider connections' base URLs, notification webhooks) may reach
-- although they are loopback, private, link-local, metadata or otherwise not global. Each row
-- is one entry: a CIDR or an address, a host name, optionally with ":port" (onward.outbound).
CREATE TABLE outbound_allow (
    org_id text NOT NULL,
    entry text NOT NULL CHECK (length(entry) BETWEEN 1 AND 300),
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (org_id, entry)
);
