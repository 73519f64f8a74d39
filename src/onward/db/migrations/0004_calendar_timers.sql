-- 0004: calendar waits (R6, R8). A timer's intent now holds a calendar rule, its zone and the
-- run data it read; recomputing moves the instant, bumps wake_n (the old wake is then ignored)
-- and writes `timer_moved` to the run's history.

ALTER TABLE history DROP CONSTRAINT history_event_known;
ALTER TABLE history ADD CONSTRAINT history_event_known CHECK (event IN (
    'run_started',      -- start_run: a new run and its first step
    'start_duplicate',  -- find_duplicate: a repeated delivery was acknowledged
    'step_ready',       -- a step may be claimed (new, or back after a retry, wake or resume)
    'step_claimed',     -- a worker took the step's lease; attempt = its fencing token
    'step_done',        -- the step settled with its output
    'step_skipped',     -- the step did nothing on purpose (e.g. consent refused)
    'step_waiting',     -- the step waits on a timer (its intent and instant in the detail)
    'step_retry',       -- a retryable failure: ready again after the backoff
    'step_released',    -- graceful shutdown handed the step back
    'lease_expired',    -- the sweeper found the lease lapsed and made the step ready
    'timer_fired',      -- a timer fired (by its wake or the sweep) and woke its step
    'timer_moved',      -- a pending timer was recomputed: old and new instants, new wake_n
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

-- Pending calendar timers, by organisation: what `timers recompute` pages through (keyset on
-- timer_id), without scanning fired or relative timers.
CREATE INDEX timers_calendar_pending ON timers (org_id, timer_id)
    WHERE fired_at IS NULL AND intent ? 'rule';
