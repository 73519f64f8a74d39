-- Pseudonyms (R14): the organisation's own key for keyed digests of contact identifiers, kept
-- in engine_secrets under the organisation's id. Made once, never rotated: a new key would
-- silently stop every erased contact's suppression from matching.

-- name: read_key
-- The organisation's pseudonym key, if it has one.
SELECT secret FROM engine_secrets WHERE org_id = (SELECT %(org_id)s::text) AND name = %(name)s;

-- name: make_key
-- Make the organisation's key (the first process to ask stores it; a concurrent maker's row
-- wins and this returns nothing, so the caller reads again).
INSERT INTO engine_secrets (org_id, name, secret) VALUES (%(org_id)s, %(name)s, %(secret)s)
ON CONFLICT (org_id, name) DO NOTHING
RETURNING secret;
