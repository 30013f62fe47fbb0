-- gradient-proxy schema, version 4: what issue 26 asked of Hetzner VMs.
--
-- vm_usage gets the outcome 'drained' (deleted after draining: the tenant
-- may not run, its link failed or its Hetzner workers were disabled) and
-- worker_addr, the source address of the VM worker's first accepted
-- handshake: its one-time token is then accepted from that address only.
-- SQLite cannot change a CHECK constraint in place, so the table is
-- copied.
--
-- hetzner_boot_failures counts each tenant's consecutive failed boots per
-- Nix system (reset when a VM of that system connects) and when the next
-- VM of that system may boot: the reconciler's backoff, kept across
-- restarts.

CREATE TABLE vm_usage_v4 (
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
    outcome        TEXT    NOT NULL CHECK (outcome IN ('creating', 'running', 'deleted', 'failed_boot', 'missing', 'lost', 'drained')),
    billed_units   INTEGER NOT NULL CHECK (billed_units >= 0),
    connected_at   BIGINT,
    draining_since BIGINT,
    worker_addr    TEXT,
    CHECK ((outcome IN ('creating', 'running')) = (deleted_at IS NULL))
);
INSERT INTO vm_usage_v4 (id, tenant_id, tenant_name, server_id, server_name, system, server_type, location, worker_id,
    created_at, deleted_at, outcome, billed_units, connected_at, draining_since, worker_addr)
    SELECT id, tenant_id, tenant_name, server_id, server_name, system, server_type, location, worker_id,
        created_at, deleted_at, outcome, billed_units, connected_at, draining_since, NULL FROM vm_usage;
DROP TABLE vm_usage;
ALTER TABLE vm_usage_v4 RENAME TO vm_usage;
CREATE INDEX vm_usage_by_tenant ON vm_usage (tenant_id, created_at);
CREATE INDEX vm_usage_open ON vm_usage (outcome);
CREATE INDEX vm_usage_by_worker ON vm_usage (worker_id);

CREATE TABLE hetzner_boot_failures (
    tenant_id      TEXT    NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    system         TEXT    NOT NULL,
    failures       INTEGER NOT NULL CHECK (failures > 0),
    last_failed_at BIGINT  NOT NULL,
    retry_at       BIGINT  NOT NULL,
    PRIMARY KEY (tenant_id, system)
);
