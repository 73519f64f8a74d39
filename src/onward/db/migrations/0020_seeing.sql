-- 0020: seeing a run (issue 15). Every effect transition writes a history row in its own
-- statement (effects.sql), so the timeline shows effects with their keys and provider results;
-- a run keeps the W3C trace context of the request that started it, so its steps continue
-- that trace (onward.tracing).

-- The `traceparent` header of the start request (webhook or POST /v1/runs), when it held a
-- valid one: '00-<trace id>-<parent span id>-<flags>'. NULL: the run's trace id is derived
-- from its run id.
ALTER TABLE runs ADD COLUMN traceparent text;

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
    'run_exceeded',     -- terminal: over its budget of steps or age (R13)
    'effect_claimed',   -- an attempt of an effect claimed it and is about to call (key, attempt, request excerpt)
    'effect_settled',   -- the provider answered with the work done: its reference and a result excerpt
    'effect_not_done',  -- the provider answered that it did not do the work: the claim withdrawn
    'effect_unknown',   -- the call may have happened (lost answer, lapsed effect lease)
    'effect_reconciled', -- an uncertain call was found at the provider by its key and settled
    'effect_review'     -- no safe way to repeat an uncertain call: parked for a person
));
