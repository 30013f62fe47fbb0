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

// UserData is the #cloud-config a VM boots with: write_files puts
// EnvFile (mode 0600) holding the proxy's /proto URL, the VM's worker ID,
// its peers line ID:TOKEN, its build slots and --require-sigs=false. The values are checked to
// be single printable lines, so nothing in them can add YAML.
func UserData(protoURL, workerID, token string, slots int) (string, error) {
	for what, v := range map[string]string{"proto URL": protoURL, "worker ID": workerID, "token": token} {
		if v == "" || strings.ContainsFunc(v, func(r rune) bool { return r < 0x21 || r > 0x7e }) {
			return "", fmt.Errorf("user data: the %s must be one line of printable ASCII without spaces", what)
		}
	}
	var b strings.Builder
	b.WriteString("#cloud-config\nwrite_files:\n")
	b.WriteString("  - path: " + EnvFile + "\n    owner: root:root\n    permissions: '0600'\n    content: |\n")
	for _, kv := range [][2]string{
		{EnvServerURL, protoURL}, {EnvWorkerID, workerID}, {EnvPeers, workerID + ":" + token},
		{EnvMaxBuilds, fmt.Sprint(slots)}, {EnvRequireSigs, "false"},
	} {
		b.WriteString("      " + kv[0] + "=" + kv[1] + "\n")
	}
	return b.String(), nil
}
