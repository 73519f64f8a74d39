-- 0010: migrating runs between versions (R11, issue 13).

-- The version a step's definition comes from, when it is not its run's: a migration writes it
-- on the step it moves (or enters), and the claim reads coalesce(steps.version, runs.version).
-- The claim locks the step row and so sees a migration that committed after its snapshot
-- began; its join to the run row does not (same snapshot), so the step row must carry it.
-- NULL on every step a worker or a start writes: the run's version.
ALTER TABLE steps ADD COLUMN version integer;

-- An operation makes passes over its runs: a run it cannot handle now (its step is in flight)
-- is deferred, and another pass follows, from the start of the cursor, until none is deferred
-- or the passes run out. `pass` is the current pass; `deferred` the runs deferred in it.
ALTER TABLE operations
    ADD COLUMN pass integer NOT NULL DEFAULT 1,
    ADD COLUMN deferred integer NOT NULL DEFAULT 0;
