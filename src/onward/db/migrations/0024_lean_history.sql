-- 0024: one history row per step attempt (issue 16). A claim writes no history row: what runs
-- now is the step row's (status 'running', owner, attempt, claimed_at), as a workflow engine's
-- mutable state holds a started activity until it ends (Temporal writes ActivityTaskStarted
-- only with its completion). The row that ends the attempt -- step_done, step_waiting,
-- step_failed, lease_expired, ... -- names the attempt, its worker and when it was claimed; a
-- run's completion rides on its last step's step_done row (detail {"run": "completed"}).
-- Older rows (step_claimed, run_completed) stay readable: the event names stay allowed.

-- When the step's current attempt was claimed (by the claim or, eagerly, by its predecessor's
-- settle); NULL before its first claim.
ALTER TABLE steps ADD COLUMN claimed_at timestamptz;

-- On a row that ends an attempt: when that attempt was claimed (the step row's claimed_at).
ALTER TABLE history ADD COLUMN claimed_at timestamptz;
