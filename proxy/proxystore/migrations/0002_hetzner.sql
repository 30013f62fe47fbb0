-- gradient-proxy schema, version 2: Hetzner Cloud workers.
--
-- Each tenant's Hetzner configuration, and vm_usage rebuilt with what the
-- reconciler keeps across restarts: the 'creating' state (a row is written
-- before the server is created, so a crash between the two leaves a
-- labelled server the next pass adopts instead of leaking), the location,
-- when the VM's worker first connected, when it began to drain, and the
-- billed units. SQLite cannot change a CHECK constraint in place, so the
-- table is copied.

-- systems is a JSON object {nix system: {"server_type", "location",
-- "slots"}}, ssh_keys a JSON array of Hetzner SSH key IDs, labels a JSON
-- object of extra server labels. snapshot_id 0 picks the newest
-- available snapshot carrying snapshot_label.
CREATE TABLE hetzner_configs (
    tenant_id      TEXT    PRIMARY KEY REFERENCES tenants (id) ON DELETE CASCADE,
    enabled        BOOLEAN NOT NULL,
    max_vms        INTEGER NOT NULL CHECK (max_vms >= 0),
    snapshot_id    BIGINT  NOT NULL CHECK (snapshot_id >= 0),
    snapshot_label TEXT    NOT NULL,
    systems        TEXT    NOT NULL,
    ssh_keys       TEXT    NOT NULL,
    labels         TEXT    NOT NULL,
    allow_fetch    BOOLEAN NOT NULL,
    allow_eval     BOOLEAN NOT NULL,
    allow_build    BOOLEAN NOT NULL,
    updated_at     BIGINT  NOT NULL,
    CHECK (snapshot_id > 0 OR snapshot_label <> '')
);

CREATE TABLE vm_usage_v2 (
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
    outcome        TEXT    NOT NULL CHECK (outcome IN ('creating', 'running', 'deleted', 'failed_boot', 'missing')),
    billed_units   INTEGER NOT NULL CHECK (billed_units >= 0),
    connected_at   BIGINT,
    draining_since BIGINT,
    CHECK ((outcome IN ('creating', 'running')) = (deleted_at IS NULL))
);
INSERT INTO vm_usage_v2 (id, tenant_id, tenant_name, server_id, server_name, system, server_type, location, worker_id,
    created_at, deleted_at, outcome, billed_units, connected_at, draining_since)
    SELECT id, tenant_id, tenant_name, server_id, server_name, system, server_type, '', worker_id,
        created_at, deleted_at, outcome, 0, NULL, NULL FROM vm_usage;
DROP TABLE vm_usage;
ALTER TABLE vm_usage_v2 RENAME TO vm_usage;
CREATE INDEX vm_usage_by_tenant ON vm_usage (tenant_id, created_at);
CREATE INDEX vm_usage_open ON vm_usage (outcome);
