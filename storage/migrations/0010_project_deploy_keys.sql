-- A project's deploy key, for fetching a private repository over SSH: the
-- public half in OpenSSH's authorized_keys form (for the repository
-- host), the private half sealed by the server (package sealbox, standard
-- base64) under a key the database never sees.
CREATE TABLE project_deploy_keys (
    project_id  TEXT   PRIMARY KEY REFERENCES projects (id) ON DELETE CASCADE,
    public_key  TEXT   NOT NULL,
    private_sealed TEXT NOT NULL,
    created_at  BIGINT NOT NULL
);
