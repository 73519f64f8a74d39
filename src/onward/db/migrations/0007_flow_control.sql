-- 0007: lanes that protect each other and the providers (R5, R18): failures counted apart from
-- claims, concurrency caps and rate limits by key, circuit breakers, cost budgets.

-- The attempts that failed (an error, or a lease that lapsed): what a retry policy counts.
-- `attempt` stays the fencing token and counts claims; a step deferred by a limit spends none.
ALTER TABLE steps ADD COLUMN failures integer NOT NULL DEFAULT 0;

ALTER TABLE steps DROP CONSTRAINT steps_wait_kind_check;
ALTER TABLE steps ADD CONSTRAINT steps_wait_kind_check CHECK (wait_kind IN (
    'timer', 'signal', 'approval', 'review', 'reconnect',
    'circuit',  -- parked: its provider's or connection's circuit is open
    'budget'    -- parked: its cost budget is exhausted
));

-- Limits by key: 'connection:<id>', 'provider:<name>' or 'org'. A concurrency cap, a rate
-- (calls per interval, spaced evenly: one call every per_seconds / calls), or both. Enforced
-- around outside calls, across every process. next_at: the earliest instant the rate lets the
-- next unbooked call go; last_at: when the last call went (no call goes sooner than an
-- interval after it, even a booked one that came back late).
CREATE TABLE limits (
    org_id         text NOT NULL,
    key            text NOT NULL,
    max_concurrent integer CHECK (max_concurrent >= 1),
    calls          integer CHECK (calls >= 1),
    per_seconds    double precision CHECK (per_seconds > 0),
    next_at        timestamptz,
    last_at        timestamptz,
    updated_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (org_id, key),
    CHECK ((calls IS NULL) = (per_seconds IS NULL))
);

-- One row per call in progress under a concurrency cap. It counts while its step is still
-- running at that attempt with a live lease: a worker that dies frees its slot when its lease
-- lapses, with nothing to clean up first.
CREATE TABLE limit_slots (
    org_id      text NOT NULL,
    key         text NOT NULL,
    run_id      text NOT NULL,
    seq         integer NOT NULL,
    attempt     integer NOT NULL,
    acquired_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (org_id, key, run_id, seq)
);

-- A step held back by a rate books the next free instant: when it comes back at that instant
-- it goes (first come, first served, no stampede of waiting steps at every free instant).
CREATE TABLE limit_bookings (
    org_id  text NOT NULL,
    key     text NOT NULL,
    run_id  text NOT NULL,
    seq     integer NOT NULL,
    slot_at timestamptz NOT NULL,
    PRIMARY KEY (org_id, key, run_id, seq)
);

-- A circuit breaker per key ('provider:<name>' or 'connection:<id>'). Closed: calls go
-- through, failures counted in a window. Open: calls park (wait_kind 'circuit') until
-- retry_at. Half-open: one probe (probe_run_id, probe_seq) goes through; its success closes
-- the circuit and resumes every parked step, its failure opens it again.
CREATE TABLE circuits (
    org_id            text NOT NULL,
    key               text NOT NULL,
    state             text NOT NULL DEFAULT 'closed' CHECK (state IN ('closed', 'open', 'half_open')),
    failures          integer NOT NULL DEFAULT 0,
    window_started_at timestamptz,
    opened_at         timestamptz,
    retry_at          timestamptz,
    probe_run_id      text,
    probe_seq         integer,
    threshold         integer NOT NULL DEFAULT 5 CHECK (threshold >= 1),
    window_seconds    double precision NOT NULL DEFAULT 30 CHECK (window_seconds > 0),
    cooldown_seconds  double precision NOT NULL DEFAULT 30 CHECK (cooldown_seconds > 0),
    updated_at        timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (org_id, key)
);
CREATE INDEX circuits_open ON circuits (org_id, retry_at) WHERE state = 'open';

-- Cost budgets per day (UTC), for the whole organisation (scope '*') or one automation, in
-- money (usd) or tokens. Use is the day's charges plus the live reservations: a reservation
-- whose lease lapsed (its worker died between reserve and settle) stops counting by itself.
CREATE TABLE budgets (
    org_id     text NOT NULL,
    scope      text NOT NULL,
    unit       text NOT NULL CHECK (unit IN ('usd', 'tokens')),
    per_day    numeric NOT NULL CHECK (per_day >= 0),
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (org_id, scope, unit)
);

CREATE TABLE budget_reservations (
    org_id      text NOT NULL,
    effect_key  text NOT NULL,
    scope       text NOT NULL,
    unit        text NOT NULL,
    amount      numeric NOT NULL,
    lease_until timestamptz NOT NULL,
    PRIMARY KEY (org_id, effect_key, scope, unit)
);
CREATE INDEX budget_reservations_scope ON budget_reservations (org_id, scope, unit, lease_until);

-- What an effect really cost, once per effect key (a replay of a settled effect charges
-- nothing again).
CREATE TABLE budget_charges (
    org_id     text NOT NULL,
    effect_key text NOT NULL,
    scope      text NOT NULL,
    unit       text NOT NULL,
    day        date NOT NULL,
    amount     numeric NOT NULL,
    charged_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (org_id, effect_key, scope, unit)
);
CREATE INDEX budget_charges_day ON budget_charges (org_id, scope, unit, day);

ALTER TABLE history DROP CONSTRAINT history_event_known;
ALTER TABLE history ADD CONSTRAINT history_event_known CHECK (event IN (
    'run_started',      -- start_run: a new run and its first step
    'start_duplicate',  -- find_duplicate: a repeated delivery was acknowledged
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
    'step_resumed',     -- a parked step is ready again (connection restored, circuit closed, budget)
    'step_parked',      -- the step needs a person or waits on a circuit or budget
    'step_failed',      -- the step failed for good
    'step_cancelled',   -- the step ended because its run was cancelled or exceeded
    'run_parked',       -- the run waits for a person
    'run_completed',    -- terminal: the run reached the end of its graph
    'run_failed',       -- terminal: a step failed for good
    'run_cancelled',    -- terminal: cancelled on request
    'run_exceeded'      -- terminal: over its budget of steps or age (R13)
));
