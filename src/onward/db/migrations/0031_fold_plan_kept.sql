-- 0031: onward_fold (0030) in PL/pgSQL, with a first test that answers a current row at once.
--
-- As a SQL function it could not be inlined (its body reads `steps` through aggregates), so
-- PostgreSQL planned its body again in every statement that called it: a settle of one step
-- that wrote its run (not eager, or completing) cost the server 0.48-0.53 ms a step before
-- 0030 and 0.79-0.92 ms with it (`onward bench throughput`, the tier "psycopg loop, onward's
-- SQL", two sittings each, 2026-12-07). PL/pgSQL keeps the plans of its statements for the
-- session, and a row that is current (upto at or before current_seq: every run whose row
-- was not left behind) reads no step at all. Same arguments, same result.
CREATE OR REPLACE FUNCTION onward_fold(r runs, upto integer, OUT ctx jsonb, OUT visits jsonb,
                                       OUT steps_executed integer, OUT current_seq integer)
LANGUAGE plpgsql STABLE AS $$
#variable_conflict use_column
DECLARE
    set_since jsonb;
    entered jsonb;
BEGIN
    ctx := r.ctx;
    visits := r.visits;
    steps_executed := r.steps_executed;
    current_seq := r.current_seq;
    IF upto IS NULL OR upto <= r.current_seq THEN
        RETURN;
    END IF;
    -- in one read of the run's steps since: the variables of those settled before upto (a
    -- later step's value wins, as the settle's merge did), and the id and iteration of each
    -- entered after current_seq (a step's pair repeats once per variable it set: the same
    -- value, so the same result)
    SELECT coalesce(jsonb_object_agg(e.key, e.value ORDER BY s.seq)
                        FILTER (WHERE s.seq < upto AND e.key IS NOT NULL), '{}'::jsonb),
           coalesce(jsonb_object_agg(s.step_id, to_jsonb(s.iteration) ORDER BY s.seq)
                        FILTER (WHERE s.seq > r.current_seq), '{}'::jsonb)
    INTO set_since, entered
    FROM steps s LEFT JOIN LATERAL jsonb_each(s.vars) AS e ON true
    WHERE s.org_id = r.org_id AND s.run_id = r.run_id
      AND s.seq >= r.current_seq AND s.seq <= upto;
    IF set_since <> '{}'::jsonb THEN
        ctx := jsonb_set(r.ctx, '{vars}', coalesce(r.ctx -> 'vars', '{}'::jsonb) || set_since);
    END IF;
    visits := r.visits || entered;
    steps_executed := r.steps_executed + (upto - r.current_seq);
    current_seq := upto;
END $$;
