// Package hetzner boots, meters and retires Hetzner Cloud VMs dedicated
// to one tenant of the federation proxy (docs/protocol/federation.md "Hetzner
// Workers", issue 19).
//
// A Reconciler runs one pass every interval: ONE server list for all
// tenants (label selector gradient-tenant), the open VM rows of
// proxystore, the tenants' configurations and links, and each tenant's
// pending jobs per Nix system from a Demand. Per pass and tenant it
//
//   - adopts a server whose row was written but whose creation was not
//     recorded (a crash between the two), and drops a row whose server
//     never appeared;
//   - deletes a labelled server without an open row and closes a row
//     whose server a list no longer shows, but neither while the server
//     or row is younger than the list grace (a list may not show a
//     server created moments ago);
//   - drains the VMs of a tenant that may not run, whose link is not
//     connecting or whose configuration is disabled (Draining to their
//     sessions) and deletes them after the drain grace (outcome
//     drained), whether or not their workers stay connected meanwhile;
//   - deletes a VM whose worker has not connected within the boot
//     deadline (outcome failed_boot, no bill), and backs the tenant's
//     system off: after n consecutive failed boots its next VM boots
//     the boot deadline·2ⁿ⁻¹ (at most BootBackoffMax) after the last
//     failure, one at a time, until a VM of it connects (the runs are
//     in the database: proxystore.BootBackoff);
//   - deletes a VM whose worker connected and then stayed away for the
//     boot deadline (outcome lost, billed for the time it ran), unless
//     the VM drains;
//   - boots min(max VMs, ceil(pending / slots)) VMs per configured
//     system from the worker snapshot, the user data a #cloud-config
//     writing /etc/gradient-worker/env (GRADIENT_WORKER_SERVER_URL,
//     GRADIENT_WORKER_ID, GRADIENT_WORKER_PEERS) for the snapshot's
//     worker unit, with a token minted for that VM alone (an argon2id
//     hash in its worker row);
//   - deletes a surplus idle VM only within the last scale-down window
//     of its billing unit, never one whose worker is busy.
//
// Bootable names the systems each tenant's VMs can boot, as of the last
// pass; the upstream leg reports them as architectures so the tenant's
// server offers their builds while no VM runs (BootableChanged re-sends
// them).
//
// A 429 or 5xx from the API backs the tenant off (1 s doubling to 5
// minutes); other tenants go on. Every API call is counted by operation
// and outcome. All state is in the database, so a restarted proxy adopts
// its VMs. Timings are configurable; tests run them in seconds with a
// clock of their own.
package hetzner
