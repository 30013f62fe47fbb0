package main

import (
	"fmt"
)

func cacheCreate(c *adminCmd, args []string) int {
	fs := c.flags()
	public := fs.Bool("public", false, "readable without credentials")
	pos, code, ok := c.parse(fs, args, "NAME")
	if !ok {
		return code
	}
	var ci cacheInfo
	raw, ok := c.call("POST", "/api/v1/caches", map[string]any{"name": pos[0], "public": *public}, &ci)
	if !ok {
		return exitFail
	}
	if c.settings.json {
		return c.printJSON(raw)
	}
	fmt.Fprintf(c.stdout, "Created cache %s (%s)\n", ci.Name, ci.ID)
	fmt.Fprintf(c.stdout, "Public key for trusted-public-keys: %s\n", ci.PublicKey)
	return exitOK
}

func cacheList(c *adminCmd, args []string) int {
	if _, code, ok := c.parse(c.flags(), args); !ok {
		return code
	}
	var caches []cacheInfo
	raw, ok := c.call("GET", "/api/v1/caches", nil, &caches)
	if !ok {
		return exitFail
	}
	if c.settings.json {
		return c.printJSON(raw)
	}
	rows := make([][]string, 0, len(caches))
	for _, ci := range caches {
		rows = append(rows, []string{ci.Name, yesNo(ci.Public), ci.ID, ci.PublicKey})
	}
	table(c.stdout, []string{"CACHE", "PUBLIC", "ID", "PUBLIC KEY"}, rows)
	return exitOK
}

func cacheShow(c *adminCmd, args []string) int {
	pos, code, ok := c.parse(c.flags(), args, "CACHE")
	if !ok {
		return code
	}
	var ci cacheInfo
	raw, ok := c.call("GET", "/api/v1/caches/"+seg(pos[0]), nil, &ci)
	if !ok {
		return exitFail
	}
	if c.settings.json {
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
func cachePublicKey(c *adminCmd, args []string) int {
	pos, code, ok := c.parse(c.flags(), args, "CACHE")
	if !ok {
		return code
	}
	var ci cacheInfo
	if _, ok := c.call("GET", "/api/v1/caches/"+seg(pos[0]), nil, &ci); !ok {
		return exitFail
	}
	if c.settings.json {
		fmt.Fprintf(c.stdout, "{\"public_key\": %q}\n", ci.PublicKey)
		return exitOK
	}
	fmt.Fprintln(c.stdout, ci.PublicKey)
	return exitOK
}

func cacheDelete(c *adminCmd, args []string) int {
	pos, code, ok := c.parse(c.flags(), args, "CACHE")
	if !ok {
		return code
	}
	if _, ok := c.call("DELETE", "/api/v1/caches/"+seg(pos[0]), nil, nil); !ok {
		return exitFail
	}
	return c.done("Deleted cache " + pos[0])
}
