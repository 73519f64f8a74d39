-- An organisation's own rows of engine_secrets (its pseudonym key, onward.pseudonyms) are the
-- API's to read and make, like any other row of that organisation: an erasure or a cancel
-- filtered by contact through the API needs the key. The engine's own rows (org '_system':
-- the database's encryption key) stay out of its sight: the policy admits only the request's
-- organisation, and no organisation the API serves starts with '_' (Engine.as_tenant).
GRANT SELECT, INSERT ON engine_secrets TO onward_api;
CREATE POLICY one_org ON engine_secrets TO onward_api
    USING (org_id = current_setting('onward.org_id', true))
    WITH CHECK (org_id = current_setting('onward.org_id', true));
