-- gradient-proxy schema, version 1: tenants, their upstream links, the
-- proxy's own workers and the metering of the VMs it boots.
--
-- Portable between SQLite and PostgreSQL, like the server's schema: IDs
-- are canonical lowercase UUID text, times are BIGINT unix milliseconds
-- (UTC), flags are BOOLEAN. The table names differ from the server's, so
-- both may share one database.

CREATE TABLE tenants (
    id         TEXT    PRIMARY KEY,
    name       TEXT    NOT NULL UNIQUE,
    may_run    BOOLEAN NOT NULL,
    created_at BIGINT  NOT NULL
);

-- A tenant's link to its Gradient server: the /proto URL and the worker
-- ID the tenant registered for the proxy there. state 'failing' (an auth
-- rejection) holds until the link is set again.
CREATE TABLE upstream_links (
    tenant_id      TEXT    PRIMARY KEY REFERENCES tenants (id) ON DELETE CASCADE,
    url            TEXT    NOT NULL,
    worker_id      TEXT    NOT NULL,
    enabled        BOOLEAN NOT NULL,
    state          TEXT    NOT NULL CHECK (state IN ('ok', 'failing')),
    failure_reason TEXT    NOT NULL,
    state_since    BIGINT  NOT NULL,
    updated_at     BIGINT  NOT NULL
);

-- One token per peer (project, cache) that registered the worker ID on
-- the tenant's server, AES-256-GCM sealed (base64) and bound to
-- (tenant_id, peer_id).
CREATE TABLE upstream_link_tokens (
    tenant_id    TEXT NOT NULL REFERENCES upstream_links (tenant_id) ON DELETE CASCADE,
    peer_id      TEXT NOT NULL,
    sealed_token TEXT NOT NULL,
    PRIMARY KEY (tenant_id, peer_id)
);

-- The proxy's own workers. A worker ID is unique across tenants; revoking
-- a worker deletes its row.
CREATE TABLE authorized_workers (
    worker_id   TEXT    PRIMARY KEY,
    tenant_id   TEXT    NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    name        TEXT    NOT NULL,
    token_hash  TEXT    NOT NULL,
    allow_fetch BOOLEAN NOT NULL,
    allow_eval  BOOLEAN NOT NULL,
    allow_build BOOLEAN NOT NULL,
    created_at  BIGINT  NOT NULL,
    UNIQUE (tenant_id, name)
);
CREATE INDEX authorized_workers_by_tenant ON authorized_workers (tenant_id);

-- One row per VM the proxy booted for a tenant, from creation to
-- deletion: the meter of its uptime. No foreign key: the meter outlives
-- a deleted tenant, so the tenant's name is kept beside its ID.
CREATE TABLE vm_usage (
    id          TEXT   PRIMARY KEY,
    tenant_id   TEXT   NOT NULL,
    tenant_name TEXT   NOT NULL,
    server_id   BIGINT NOT NULL,
    server_name TEXT   NOT NULL,
    system      TEXT   NOT NULL,
    server_type TEXT   NOT NULL,
    worker_id   TEXT   NOT NULL,
    created_at  BIGINT NOT NULL,
    deleted_at  BIGINT,
    outcome     TEXT   NOT NULL CHECK (outcome IN ('running', 'deleted', 'failed_boot')),
    CHECK ((outcome = 'running') = (deleted_at IS NULL))
);
CREATE INDEX vm_usage_by_tenant ON vm_usage (tenant_id, created_at);
