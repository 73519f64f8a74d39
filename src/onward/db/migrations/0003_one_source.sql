-- 0003: one source for the formats every transition shares, and a closed list of history
-- events. docs/state-machine.md describes each event once.

-- Wake job ids (R16). A step wake names the attempt it invites, a timer wake its wake number:
-- a queue that keeps finished job ids (BullMQ, the Redis adapter) silently drops a job whose id
-- it has seen, so an id without them would swallow the second wake of a retried step.
-- IMMUTABLE SQL functions the planner inlines, so they cost nothing on the hot path. Their
-- bodies must be immutable too (explicit ::text casts: `integer || text` goes through a STABLE
-- operator, which would stop the inlining and cost a function call per row).
-- onward.ids builds the same strings in Python (tests compare the two).
CREATE FUNCTION onward_step_wake_id(run_id text, seq integer, attempt integer)
RETURNS text LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN 'wake:' || run_id || ':' || seq::text || ':' || attempt::text;

CREATE FUNCTION onward_timer_wake_id(org_id text, timer_id bigint, wake_n integer)
RETURNS text LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN 'timer:' || org_id || ':' || timer_id::text || ':' || wake_n::text;

ALTER TABLE history ADD CONSTRAINT history_event_known CHECK (event IN (
    'run_started',      -- start_run: a new run and its first step
    'start_duplicate',  -- find_duplicate: a repeated delivery was acknowledged
    'step_ready',       -- a step may be claimed (new, or back after a retry, wake or resume)
    'step_claimed',     -- a worker took the step's lease; attempt = its fencing token
    'step_done',        -- the step settled with its output
    'step_skipped',     -- the step did nothing on purpose (e.g. consent refused)
    'step_waiting',     -- the step waits on a timer
    'step_retry',       -- a retryable failure: ready again after the backoff
    'step_released',    -- graceful shutdown handed the step back
    'lease_expired',    -- the sweeper found the lease lapsed and made the step ready
    'timer_fired',      -- a timer fired (by its wake or the sweep) and woke its step
    'step_resumed',     -- a parked step is ready again (its connection was restored)
    'step_parked',      -- the step needs a person (review, reconnect)
    'step_failed',      -- the step failed for good
    'step_cancelled',   -- the step ended because its run was cancelled or exceeded
    'run_parked',       -- the run waits for a person
    'run_completed',    -- terminal: the run reached the end of its graph
    'run_failed',       -- terminal: a step failed for good
    'run_cancelled',    -- terminal: cancelled on request
    'run_exceeded'      -- terminal: over its budget of steps or age (R13)
));
