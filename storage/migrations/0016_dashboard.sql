-- The web dashboard: scoped API tokens, browser sessions, public
-- projects, and an index for its paged build lists.
--
-- API tokens and sessions are random 256-bit secrets, so only their
-- SHA-256 (hex) is stored and a presented one is found by its digest.
-- scope is what the holder may do: 'read' (GET only) or 'admin'.
CREATE TABLE api_tokens (
    id           TEXT   PRIMARY KEY,
    name         TEXT   NOT NULL,
    scope        TEXT   NOT NULL CHECK (scope IN ('read', 'admin')),
    token_digest TEXT   NOT NULL UNIQUE,
    created_at   BIGINT NOT NULL
);

-- A logged-in browser. token_id names the API token it logged in with
-- (NULL: the admin token); revoking the token ends its sessions.
CREATE TABLE dashboard_sessions (
    digest     TEXT   PRIMARY KEY,
    scope      TEXT   NOT NULL CHECK (scope IN ('read', 'admin')),
    token_id   TEXT   REFERENCES api_tokens (id) ON DELETE CASCADE,
    created_at BIGINT NOT NULL,
    expires_at BIGINT NOT NULL
);
CREATE INDEX dashboard_sessions_by_expiry ON dashboard_sessions (expires_at);

-- Projects whose evaluations, builds and logs anyone may read.
CREATE TABLE public_projects (
    project_id TEXT PRIMARY KEY REFERENCES projects (id) ON DELETE CASCADE
);

-- An evaluation's builds of one status by ID: the dashboard's keyset pages.
CREATE INDEX builds_by_status_id ON builds (evaluation_id, status, id);
