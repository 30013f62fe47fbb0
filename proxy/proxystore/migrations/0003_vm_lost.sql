-- gradient-proxy schema, version 3: the outcome 'lost', a VM whose worker
-- connected and then stayed away longer than the boot deadline. SQLite
-- cannot change a CHECK constraint in place, so the table is copied.

CREATE TABLE vm_usage_v3 (
    id             TEXT    PRIMARY KEY,
    tenant_id      TEXT    NOT NULL,
    tenant_name    TEXT    NOT NULL,
    server_id      BIGINT  NOT NULL,
    server_name    TEXT    NOT NULL,
    system         TEXT    NOT NULL,
    server_type    TEXT    NOT NULL,
    location       TEXT    NOT NULL,
    worker_id      TEXT    NOT NULL,
    created_at     BIGINT  NOT NULL,
    deleted_at     BIGINT,
    outcome        TEXT    NOT NULL CHECK (outcome IN ('creating', 'running', 'deleted', 'failed_boot', 'missing', 'lost')),
    billed_units   INTEGER NOT NULL CHECK (billed_units >= 0),
    connected_at   BIGINT,
    draining_since BIGINT,
    CHECK ((outcome IN ('creating', 'running')) = (deleted_at IS NULL))
);
INSERT INTO vm_usage_v3 (id, tenant_id, tenant_name, server_id, server_name, system, server_type, location, worker_id,
    created_at, deleted_at, outcome, billed_units, connected_at, draining_since)
    SELECT id, tenant_id, tenant_name, server_id, server_name, system, server_type, location, worker_id,
        created_at, deleted_at, outcome, billed_units, connected_at, draining_since FROM vm_usage;
DROP TABLE vm_usage;
ALTER TABLE vm_usage_v3 RENAME TO vm_usage;
CREATE INDEX vm_usage_by_tenant ON vm_usage (tenant_id, created_at);
CREATE INDEX vm_usage_open ON vm_usage (outcome);
