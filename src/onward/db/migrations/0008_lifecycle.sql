-- A run's whole life (R11, R12, R14, B2/B3): cancellation at safe points, migration between
-- versions, erasure, operator actions and retention. Later migrations of this issue add the
-- tables only one module needs (notification delivery, erasure records).

-- Published versions are immutable in the database too (R11): a run finishes on the version it
-- started on only if nobody can edit that version in place. A change is a new version.
CREATE FUNCTION onward_version_immutable() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'automation % version % is published and cannot be changed or removed',
        OLD.automation_id, OLD.version
        USING ERRCODE = 'restrict_violation';
END;
$$;

CREATE TRIGGER automation_versions_immutable
    BEFORE UPDATE OR DELETE ON automation_versions
    FOR EACH ROW EXECUTE FUNCTION onward_version_immutable();

-- Who asked for the cancel (R12; cancel_requested_at exists since 0001 and is honoured at the
-- next claim), the run a fork was made from (an operator's retry from a chosen step), and when
-- the run's personal data was erased (R14).
ALTER TABLE runs
    ADD COLUMN cancel_requested_by text,
    ADD COLUMN forked_from text,
    ADD COLUMN erased_at timestamptz;

CREATE INDEX runs_contact ON runs (org_id, contact_id) WHERE contact_id IS NOT NULL;
CREATE INDEX runs_by_version ON runs (org_id, automation_id, version, run_id)
    WHERE finished_at IS NULL;
CREATE INDEX runs_finished ON runs (org_id, finished_at) WHERE finished_at IS NOT NULL;

-- A step whose step id a migration removed, under the 'park' policy, waits for a person.
ALTER TABLE steps DROP CONSTRAINT steps_wait_kind_check;
ALTER TABLE steps ADD CONSTRAINT steps_wait_kind_check CHECK (wait_kind IN (
    'timer', 'signal', 'approval', 'review', 'reconnect', 'circuit', 'budget', 'migration'
));

-- Retention: finished runs older than this are deleted with all their rows by the elected
-- leader; NULL keeps them (the engine's default, ONWARD_RETENTION_DAYS, applies then).
ALTER TABLE organisations ADD COLUMN retention_days double precision
    CHECK (retention_days > 0);

-- A bulk operation over many runs (cancel by automation or filter, migrate a version): done in
-- batches, each batch and its progress in one transaction, so a crash leaves every run either
-- moved or not and the operation resumes from its cursor (after_run_id).
CREATE TABLE operations (
    org_id       text NOT NULL,
    operation_id text NOT NULL,
    kind         text NOT NULL CHECK (kind IN ('cancel', 'migrate')),
    params       jsonb NOT NULL,
    requested_by text NOT NULL,
    status       text NOT NULL DEFAULT 'running' CHECK (status IN ('running', 'done', 'failed')),
    after_run_id text NOT NULL DEFAULT '',
    done         integer NOT NULL DEFAULT 0,
    outcomes     jsonb NOT NULL DEFAULT '{}',
    error        text,
    lease_until  timestamptz,
    created_at   timestamptz NOT NULL DEFAULT now(),
    updated_at   timestamptz NOT NULL DEFAULT now(),
    finished_at  timestamptz,
    PRIMARY KEY (org_id, operation_id)
);
CREATE INDEX operations_running ON operations (org_id, lease_until) WHERE status = 'running';

ALTER TABLE history DROP CONSTRAINT history_event_known;
ALTER TABLE history ADD CONSTRAINT history_event_known CHECK (event IN (
    'run_started',      -- a run was created (detail: start key and its kind)
    'start_duplicate',  -- the same start key came again: same run, nothing new
    'step_ready',       -- a step may be claimed (new, or back after a retry, wake or resume)
    'step_claimed',     -- a worker took the step's lease; attempt = its fencing token
    'step_done',        -- the step settled with its output
    'step_skipped',     -- the step did nothing on purpose (e.g. consent refused)
    'step_waiting',     -- the step waits on a timer, a signal or a person (detail: on what)
    'step_retry',       -- a retryable failure: ready again after the backoff
    'step_deferred',    -- a limit (cap, rate) held the call back: ready again, no attempt spent
    'step_released',    -- graceful shutdown handed the step back
    'lease_expired',    -- the sweeper found the lease lapsed and made the step ready
    'timer_fired',      -- a timer fired (by its wake or the sweep) and woke its step
    'timer_moved',      -- a pending timer was recomputed: old and new instants, new wake_n
    'signal_consumed',  -- a signal woke its waiting step (the deadline lost, if it had one)
    'signal_refused',   -- a signal came for a finished or cancelled run
    'signal_late',      -- a signal came after the deadline of the step that waited on it won
    'approval_requested', -- a decision was asked for (content digest, approvers, deadline)
    'approval_decided', -- the first decision: it woke the step
    'approval_refused', -- a click or call that decided nothing (expired, revoked, stale, ...)
    'approval_expired', -- the deadline passed with no decision (then the policy applies)
    'circuit_opened',   -- this run's failure opened a circuit (its steps park, retries kept)
    'circuit_half_open', -- the cool-down passed: this run's step is the one probe
    'circuit_closed',   -- the probe succeeded: the circuit closed and this run resumed
    'cancel_requested', -- a cancel came while a step was in flight: honoured at the next safe point
    'run_migrated',     -- an operator moved the run to another version (from, to, map, who)
    'run_erased',       -- the contact's data was removed from the run (who, when); details redacted
    'review_resolved',  -- an operator resolved an effect parked for review (how, reference, who)
    'run_forked',       -- a new run was made from a step of this one, or this run is that fork
    'step_resumed',     -- a parked step is ready again (connection restored, circuit closed, budget, operator)
    'step_parked',      -- the step needs a person or waits on a circuit or budget
    'step_failed',      -- the step failed for good
    'step_cancelled',   -- the step ended because its run was cancelled or exceeded
    'run_parked',       -- the run waits for a person
    'run_completed',    -- terminal: the run reached the end of its graph
    'run_failed',       -- terminal: a step failed for good
    'run_cancelled',    -- terminal: cancelled on request
    'run_exceeded'      -- terminal: over its budget of steps or age (R13)
));
