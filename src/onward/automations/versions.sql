-- name: lock_automation
-- Upsert the automation row and lock it, so two publishers of one automation serialise.
INSERT INTO automations (org_id, automation_id, latest_version)
VALUES (%(org_id)s, %(automation_id)s, 0)
ON CONFLICT (org_id, automation_id) DO UPDATE SET updated_at = automations.updated_at
RETURNING latest_version;

-- name: find_by_digest
-- The latest version, if it has exactly this content (publishing it again is a no-op). An
-- older version with this content does not count: publishing it again makes it current.
SELECT v.version FROM automations a
JOIN automation_versions v
  ON v.org_id = a.org_id AND v.automation_id = a.automation_id AND v.version = a.latest_version
WHERE a.org_id = (SELECT %(org_id)s::text) AND a.automation_id = %(automation_id)s AND v.digest = %(digest)s;

-- name: insert_version
-- Versions are immutable: inserted once, never updated.
WITH v AS (
    INSERT INTO automation_versions (org_id, automation_id, version, digest, document,
                                     start_step_id, start_kind, start_lane, max_steps, max_age_s)
    VALUES (%(org_id)s, %(automation_id)s, %(version)s, %(digest)s, %(document)s,
            %(start_step_id)s, %(start_kind)s, %(start_lane)s, %(max_steps)s, %(max_age_s)s)
    RETURNING version
)
UPDATE automations SET latest_version = (SELECT version FROM v), updated_at = now()
WHERE org_id = (SELECT %(org_id)s::text) AND automation_id = %(automation_id)s
RETURNING latest_version;

-- name: get_version
-- One published version's document.
SELECT version, digest, document, published_at FROM automation_versions
WHERE org_id = (SELECT %(org_id)s::text) AND automation_id = %(automation_id)s AND version = %(version)s;

-- name: latest
-- The newest published version of an automation.
SELECT a.latest_version AS version, v.document
FROM automations a
JOIN automation_versions v USING (org_id, automation_id)
WHERE a.org_id = (SELECT %(org_id)s::text) AND a.automation_id = %(automation_id)s
  AND v.version = a.latest_version;

-- name: list_automations
-- Every automation of an organisation with its latest version.
SELECT automation_id, latest_version, updated_at FROM automations
WHERE org_id = (SELECT %(org_id)s::text) AND latest_version > 0 ORDER BY automation_id;

-- name: ensure_org
-- Organisations are created on first use.
INSERT INTO organisations (org_id) VALUES (%(org_id)s) ON CONFLICT (org_id) DO NOTHING;
