package hetzner

import (
	"fmt"
	"strings"
)

// EnvFile is where the VM's worker unit reads its environment.
const EnvFile = "/etc/gradient-worker/env"

// The variables of the env file, as gradient-worker reads them.
const (
	EnvServerURL = "GRADIENT_WORKER_SERVER_URL"
	EnvWorkerID  = "GRADIENT_WORKER_ID"
	EnvPeers     = "GRADIENT_WORKER_PEERS"
	EnvMaxBuilds = "GRADIENT_WORKER_BUILD_MAX_CONCURRENT"
	// EnvRequireSigs is false: the VM's store serves one tenant and dies
	// with the VM, a trust domain of its own, and the proxy does not
	// know the tenant's cache keys (docs/SECURITY.md, "What a server can
	// make a worker's store hold").
	EnvRequireSigs = "GRADIENT_WORKER_REQUIRE_SIGS"
)

// MetadataAddress is the cloud's metadata service, which serves the
// user data (and so the VM's worker token) to whoever on the VM asks.
const MetadataAddress = "169.254.169.254"

// metadataFirewall is the bootcmd script run at every boot, before
// write_files: only root may reach the metadata service (builds run as
// the nixbld users, and the worker should run as a user of its own).
// nftables if the image has it, else iptables; an image with neither
// is powered off before its worker can start, which the reconciler
// then counts as a failed boot.
const metadataFirewall = `if command -v nft >/dev/null 2>&1 && nft -f - <<'EOF'
table inet gradient_metadata
delete table inet gradient_metadata
table inet gradient_metadata {
  chain output {
    type filter hook output priority 0; policy accept;
    ip daddr ` + MetadataAddress + ` meta skuid != 0 reject
  }
}
EOF
then :
elif command -v iptables >/dev/null 2>&1 && { iptables -w -C OUTPUT -d ` + MetadataAddress + `/32 -m owner ! --uid-owner 0 -j REJECT 2>/dev/null || iptables -w -I OUTPUT 1 -d ` + MetadataAddress + `/32 -m owner ! --uid-owner 0 -j REJECT; }
then :
else
  echo "gradient: no nft or iptables to keep the metadata service from non-root users; powering off" >&2
  poweroff
fi
`

// UserData is the #cloud-config a VM boots with: bootcmd firewalls the
// metadata service from every user but root at each boot
// (metadataFirewall), then write_files puts EnvFile (root's, mode 0600)
// holding the proxy's /proto URL, the VM's worker ID, its peers line
// ID:TOKEN, its build slots and --require-sigs=false. The values are
// checked to be single printable lines, so nothing in them can add YAML.
func UserData(protoURL, workerID, token string, slots int) (string, error) {
	for what, v := range map[string]string{"proto URL": protoURL, "worker ID": workerID, "token": token} {
		if v == "" || strings.ContainsFunc(v, func(r rune) bool { return r < 0x21 || r > 0x7e }) {
			return "", fmt.Errorf("user data: the %s must be one line of printable ASCII without spaces", what)
		}
	}
	var b strings.Builder
	b.WriteString("#cloud-config\nbootcmd:\n  - |\n")
	for _, line := range strings.SplitAfter(metadataFirewall, "\n") {
		if line != "" {
			b.WriteString("    " + line)
		}
	}
	b.WriteString("write_files:\n")
	b.WriteString("  - path: " + EnvFile + "\n    owner: root:root\n    permissions: '0600'\n    content: |\n")
	for _, kv := range [][2]string{
		{EnvServerURL, protoURL}, {EnvWorkerID, workerID}, {EnvPeers, workerID + ":" + token},
		{EnvMaxBuilds, fmt.Sprint(slots)}, {EnvRequireSigs, "false"},
	} {
		b.WriteString("      " + kv[0] + "=" + kv[1] + "\n")
	}
	return b.String(), nil
}
