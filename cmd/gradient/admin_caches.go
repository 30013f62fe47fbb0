package main

import (
	"fmt"
)

func cacheCreate(c *adminCmd) int {
	pos := c.args
	public := c.cmd.Bool("public")
	var ci cacheInfo
	raw, ok := c.call("POST", "/api/v1/caches", map[string]any{"name": pos[0], "public": public}, &ci)
	if !ok {
		return exitFail
	}
	if c.json {
		return c.printJSON(raw)
	}
	fmt.Fprintf(c.stdout, "Created cache %s (%s)\n", ci.Name, ci.ID)
	fmt.Fprintf(c.stdout, "Public key for trusted-public-keys: %s\n", ci.PublicKey)
	return exitOK
}

func cacheList(c *adminCmd) int {
	var caches []cacheInfo
	raw, ok := c.call("GET", "/api/v1/caches", nil, &caches)
	if !ok {
		return exitFail
	}
	if c.json {
		return c.printJSON(raw)
	}
	rows := make([][]string, 0, len(caches))
	for _, ci := range caches {
		rows = append(rows, []string{ci.Name, yesNo(ci.Public), ci.ID, ci.PublicKey})
	}
	table(c.stdout, []string{"CACHE", "PUBLIC", "ID", "PUBLIC KEY"}, rows)
	return exitOK
}

func cacheShow(c *adminCmd) int {
	pos := c.args
	var ci cacheInfo
	raw, ok := c.call("GET", "/api/v1/caches/"+seg(pos[0]), nil, &ci)
	if !ok {
		return exitFail
	}
	if c.json {
		return c.printJSON(raw)
	}
	fields(c.stdout,
		"cache", ci.Name,
		"id", ci.ID,
		"public", yesNo(ci.Public),
		"projects", listOrDash(ci.Projects),
		"created", when(ci.CreatedAt),
		"public key", ci.PublicKey)
	return exitOK
}

// cachePublicKey prints only the key, for scripts:
// nix.settings.trusted-public-keys = [ "$(gradient cache public-key main)" ].
func cachePublicKey(c *adminCmd) int {
	pos := c.args
	var ci cacheInfo
	if _, ok := c.call("GET", "/api/v1/caches/"+seg(pos[0]), nil, &ci); !ok {
		return exitFail
	}
	if c.json {
		fmt.Fprintf(c.stdout, "{\"public_key\": %q}\n", ci.PublicKey)
		return exitOK
	}
	fmt.Fprintln(c.stdout, ci.PublicKey)
	return exitOK
}

func cacheDelete(c *adminCmd) int {
	pos := c.args
	if _, ok := c.call("DELETE", "/api/v1/caches/"+seg(pos[0]), nil, nil); !ok {
		return exitFail
	}
	return c.done("Deleted cache " + pos[0])
}
