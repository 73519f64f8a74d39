-- 0032: a step whose output is its variables stores them once (issue 16).
--
-- A `set` step returns one dict as both its output and its variables; its settle stored it
-- twice on the step row (`output` and `vars`, since 0029), ~25 bytes more of every such row
-- and of the WAL of its settle, and parsed twice by the grouped settle. Now the worker says so
-- (`same` in leases.sql settle_advance's batch) and the settle stores it once, as `vars` --
-- what onward_fold reads -- leaving `output` NULL. A settled step's `output` is otherwise
-- never SQL NULL (a JSON null stays the JSON null), so the rule is exact: a step's output is
-- `coalesce(output, vars)`. Every reader of a step's output reads it through this function,
-- the rule's one statement (history.sql steps_of_run, actions.sql fork_steps,
-- run_migrations.sql outputs, chaos's check of the provider work done). Erasure redacts
-- `vars`, so such a step's output reads as redacted too. A fork's copies of settled steps
-- (start.sql fork_run) copy both columns as they are.
CREATE FUNCTION onward_step_output(s steps) RETURNS jsonb
LANGUAGE sql IMMUTABLE AS $$
    SELECT coalesce(s.output, s.vars)
$$;
