-- Operator actions (issue 13, B2/B3): resolve a run parked for review, resume a parked run,
-- fork a finished run from a chosen step.

-- An effect a person skipped: the run went on without it. Never called again; a late result of
-- an attempt still calling may still settle it (a result is a fact).
ALTER TABLE effects DROP CONSTRAINT effects_status_check;
ALTER TABLE effects ADD CONSTRAINT effects_status_check CHECK (status IN (
    'in_flight', 'outcome_unknown', 'settled', 'review', 'skipped'
));

-- Who allowed one more attempt with the same idempotency key of an effect parked for review
-- ("retry"): the next attempt calls the provider although it offers no idempotency. The
-- attempt that begins clears it, so a second uncertain outcome parks for review again.
ALTER TABLE effects ADD COLUMN retry_approved_by text;

-- The effects of a step that wait for a person (resolve finds them by the parked step).
CREATE INDEX effects_review ON effects (org_id, run_id, seq) WHERE status = 'review';

-- The variables a done step set (its Advance's vars; NULL: none). runs.ctx holds them merged;
-- a fork from an earlier step rebuilds the variables as they were before it from these.
ALTER TABLE steps ADD COLUMN vars jsonb;

-- A fork's start key is made by the engine from the run and step entry it was forked from
-- (`fork:<run_id>:<seq>:v<version>`): asking for the same fork twice finds the first.
ALTER TABLE runs DROP CONSTRAINT runs_start_key_kind_check;
ALTER TABLE runs ADD CONSTRAINT runs_start_key_kind_check CHECK (start_key_kind IN (
    'event', 'payload_hash', 'caller', 'fork'
));
