-- Audit (issue 14, Build 6): who changed what in an organisation, and when. One row per
-- publish, cancel (one run, or a bulk operation), erasure, operator action (review resolve,
-- resume, fork), migration, retention change, notification destination change, connection
-- add/restore, approver grant/revoke and limit/circuit/budget change -- written by
-- ``audit.record`` in the same transaction as the change it records, so neither exists
-- without the other. Not run data: retention deletes nothing here; ``detail`` never holds a
-- secret nor a contact's identifiers (an erasure's row names the pseudonym only).
CREATE TABLE audit (
    org_id   text NOT NULL,
    audit_id bigint GENERATED ALWAYS AS IDENTITY,
    at       timestamptz NOT NULL DEFAULT now(),
    actor    text NOT NULL,
    action   text NOT NULL,
    target   text NOT NULL,
    detail   jsonb NOT NULL DEFAULT '{}',
    PRIMARY KEY (org_id, audit_id)
);
CREATE INDEX audit_by_action ON audit (org_id, action, audit_id);
