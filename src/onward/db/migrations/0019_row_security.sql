-- Row-level security (issue 14, Build 2): every table with org_id lets a connection see and
-- change only the rows its role's policy admits, whoever wrote the query.
--
-- Two roles, made here if the cluster does not have them yet (roles belong to the cluster, so
-- several onward databases share them), both NOLOGIN: a process connects as the URL's user and
-- becomes one of them with SET ROLE (onward.db.make_pool), so no new password exists.
--   onward_api    the HTTP API's connections: a row is visible (and writable) only when its
--                 org_id equals the setting onward.org_id, which the API sets for the
--                 organisation of the request's key on each connection it lends (and the pool
--                 resets on return). With no organisation set, every query sees no row.
--   onward_engine workers, the sweeper, the relays, the CLI: their work crosses
--                 organisations by design (a fair sweep, a relay of every org's outbox), and
--                 their policy says so explicitly: USING (true).
-- FORCE applies the policies to the tables' owner as well (a superuser still bypasses them:
-- that is the migrating user here, never a role the engine runs as). The engine's own tables
-- (engine_secrets, leader_leases, onward_migrations; org '_system') are not granted to
-- onward_api at all.
DO $$
BEGIN
    CREATE ROLE onward_api NOLOGIN;
EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL;  -- another database made it
END $$;
DO $$
BEGIN
    CREATE ROLE onward_engine NOLOGIN;
EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL;
END $$;

-- the migrating user may become either role (a superuser may anyway: no grant, which would
-- race with another database's migration over the same cluster-wide row)
DO $$
BEGIN
    IF NOT (SELECT rolsuper FROM pg_roles WHERE rolname = current_user) THEN
        EXECUTE format('GRANT onward_api, onward_engine TO %I', current_user);
    END IF;
END $$;
GRANT USAGE ON SCHEMA public TO onward_api, onward_engine;
GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA public TO onward_api, onward_engine;

-- onward_secure(table): row-level security and both roles' policies on one table; every later
-- migration that creates a table with org_id calls it (tests/contracts check that each does).
CREATE FUNCTION onward_secure(t regclass) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE format('ALTER TABLE %s ENABLE ROW LEVEL SECURITY', t);
    EXECUTE format('ALTER TABLE %s FORCE ROW LEVEL SECURITY', t);
    EXECUTE format('GRANT SELECT, INSERT, UPDATE, DELETE, TRUNCATE ON %s TO onward_engine', t);
    EXECUTE format(
        'CREATE POLICY every_org ON %s TO onward_engine USING (true) WITH CHECK (true)', t);
    IF t::text NOT IN ('engine_secrets', 'leader_leases', 'onward_migrations') THEN
        EXECUTE format('GRANT SELECT, INSERT, UPDATE, DELETE ON %s TO onward_api', t);
        EXECUTE format(
            'CREATE POLICY one_org ON %s TO onward_api'
            ' USING (org_id = current_setting(''onward.org_id'', true))'
            ' WITH CHECK (org_id = current_setting(''onward.org_id'', true))', t);
    END IF;
END $$;

SELECT onward_secure(c.oid)
FROM pg_class c
WHERE c.relnamespace = 'public'::regnamespace AND c.relkind IN ('r', 'p')
  AND EXISTS (SELECT 1 FROM pg_attribute a
              WHERE a.attrelid = c.oid AND a.attname = 'org_id' AND NOT a.attisdropped)
ORDER BY c.relname;
