-- 0031: onward_fold (0030) inlined into the statements that call it, in one read of the steps.
--
-- Declared to return `record` (OUT parameters), a SQL function whose body reads a table is not
-- inlined: PostgreSQL planned its body again in every statement that called it, and a settle
-- of one step that wrote its run (not eager, or completing) cost the server 0.48-0.53 ms a
-- step before 0030 and 0.79-0.92 ms with it (`onward bench throughput`, the tier "psycopg loop,
-- onward's SQL", two sittings each, 2026-12-07). In PL/pgSQL (plans kept for the session) the
-- grouped settle's completion still took 82-87 us a row against 48 before 0030 (EXPLAIN
-- ANALYZE, batches of 64): a call and an SPI query each. Returning a table (one row), a SQL
-- function in FROM is planned as a subquery of its caller, with the caller's plan, and reads
-- the run's steps since current_seq in one index range scan -- none read at all for upto at
-- or before current_seq. Same arguments, same result; onward_run_now likewise.
DROP FUNCTION onward_run_now(runs);
DROP FUNCTION onward_fold(runs, integer);

CREATE FUNCTION onward_fold(r runs, upto integer)
RETURNS TABLE (ctx jsonb, visits jsonb, steps_executed integer, current_seq integer)
LANGUAGE sql STABLE ROWS 1 AS $$
    -- in one read of the run's steps since current_seq: the variables of those settled before
    -- upto (a later step's value wins, as the settle's merge did), and the id and iteration of
    -- each entered after current_seq (a step's pair repeats once per variable it set: the same
    -- value, so the same result)
    SELECT CASE WHEN f.set_since = '{}'::jsonb THEN r.ctx
                ELSE jsonb_set(r.ctx, '{vars}',
                               coalesce(r.ctx -> 'vars', '{}'::jsonb) || f.set_since)
           END,
           r.visits || f.entered,
           r.steps_executed + greatest(upto - r.current_seq, 0),
           greatest(r.current_seq, upto)
    FROM (SELECT coalesce(jsonb_object_agg(e.key, e.value ORDER BY s.seq)
                              FILTER (WHERE s.seq < upto AND e.key IS NOT NULL),
                          '{}'::jsonb) AS set_since,
                 coalesce(jsonb_object_agg(s.step_id, to_jsonb(s.iteration) ORDER BY s.seq)
                              FILTER (WHERE s.seq > r.current_seq),
                          '{}'::jsonb) AS entered
          FROM steps s LEFT JOIN LATERAL jsonb_each(s.vars) AS e ON true
          WHERE s.org_id = r.org_id AND s.run_id = r.run_id
            AND s.seq >= r.current_seq AND s.seq <= upto) AS f
$$;

-- The run as it is now: folded up to its latest step (what a reader shows; a row that is
-- current comes back as it is, after one probe of steps_pkey).
CREATE FUNCTION onward_run_now(r runs)
RETURNS TABLE (ctx jsonb, visits jsonb, steps_executed integer, current_seq integer)
LANGUAGE sql STABLE ROWS 1 AS $$
    SELECT f.ctx, f.visits, f.steps_executed, f.current_seq
    FROM onward_fold(r, coalesce((SELECT max(s.seq) FROM steps s
                                  WHERE s.org_id = r.org_id AND s.run_id = r.run_id),
                                 r.current_seq)) AS f
$$;
