-- Erasure (R14): a contact's data removed from every run that references it, the contact
-- suppressed by a pseudonym (never in clear text), and a durable record of the request.

-- One row per erased contact, keyed by its pseudonym (onward.pseudonyms: HMAC-SHA256 of the
-- normalised contact id under the organisation's own key), never by the contact id itself.
-- 'pending' until every run of the contact has been erased: a run with a step in flight when
-- the erasure came is cancel-requested and erased once it stops (the elected sweeper, or the
-- same request again, completes the erasure). The row holds no identifier in clear text.
CREATE TABLE erasures (
    org_id       text NOT NULL,
    subject      text NOT NULL,
    status       text NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'done')),
    digests      text[] NOT NULL DEFAULT '{}',  -- pseudonyms of every identifier erased
    requested_by text NOT NULL,
    requests     integer NOT NULL DEFAULT 1,
    runs_erased  integer NOT NULL DEFAULT 0,
    requested_at timestamptz NOT NULL DEFAULT now(),
    updated_at   timestamptz NOT NULL DEFAULT now(),
    finished_at  timestamptz,
    PRIMARY KEY (org_id, subject)
);
CREATE INDEX erasures_pending ON erasures (org_id, requested_at) WHERE status = 'pending';

-- A run's rows, found by its run id (erasure, and retention's deletes).
CREATE INDEX effects_by_run ON effects (org_id, run_id);
CREATE INDEX signals_by_run ON signals (org_id, run_id) WHERE run_id IS NOT NULL;
CREATE INDEX correlations_by_run ON correlations (org_id, run_id);
