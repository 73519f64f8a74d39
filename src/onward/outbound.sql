-- name: entries
-- The organisation's allow-list entries, sorted.
SELECT entry FROM outbound_allow WHERE org_id = (SELECT %(org_id)s::text) ORDER BY entry;

-- name: add
-- Add entries to the organisation's allow-list (an entry already there stays as it was).
INSERT INTO outbound_allow (org_id, entry)
SELECT %(org_id)s, e FROM unnest(%(entries)s::text[]) AS e
ON CONFLICT (org_id, entry) DO NOTHING;

-- name: remove
-- Remove entries from the organisation's allow-list.
DELETE FROM outbound_allow WHERE org_id = (SELECT %(org_id)s::text) AND entry = ANY(%(entries)s::text[]);

-- name: count
-- How many entries the organisation's allow-list has (capped at MAX_ENTRIES).
SELECT count(*) AS n FROM outbound_allow WHERE org_id = (SELECT %(org_id)s::text);
