package main

import (
	"fmt"
	"strings"
	"time"
)

// cachePathInfo is a cache path in the server's answers.
type cachePathInfo struct {
	StorePath   string    `json:"store_path"`
	NarHash     string    `json:"nar_hash"`
	NarSize     int64     `json:"nar_size"`
	FileHash    string    `json:"file_hash"`
	FileSize    int64     `json:"file_size"`
	Compression string    `json:"compression"`
	References  []string  `json:"references"`
	Deriver     string    `json:"deriver"`
	CA          string    `json:"ca"`
	CreatedAt   time.Time `json:"created_at"`
	Created     *bool     `json:"created"`
	Narinfo     string    `json:"narinfo"`
}

func cachePaths(c *adminCmd) int {
	pos := c.args
	var paths []cachePathInfo
	raw, ok := c.call("GET", "/api/v1/caches/"+seg(pos[0])+"/paths", nil, &paths)
	if !ok {
		return exitFail
	}
	if c.json {
		return c.printJSON(raw)
	}
	rows := make([][]string, 0, len(paths))
	for _, p := range paths {
		rows = append(rows, []string{p.StorePath, fmt.Sprint(p.NarSize), fmt.Sprint(p.FileSize), when(p.CreatedAt)})
	}
	table(c.stdout, []string{"STORE PATH", "NAR SIZE", "FILE SIZE", "ADDED"}, rows)
	return exitOK
}

// cacheNarinfo prints the narinfo the cache serves for a path, given as
// /nix/store/HASH-NAME, HASH-NAME or HASH.
func cacheNarinfo(c *adminCmd) int {
	pos := c.args
	ref := strings.TrimPrefix(pos[1], "/nix/store/")
	var p cachePathInfo
	raw, ok := c.call("GET", "/api/v1/caches/"+seg(pos[0])+"/paths/"+seg(ref), nil, &p)
	if !ok {
		return exitFail
	}
	if c.json {
		return c.printJSON(raw)
	}
	fmt.Fprint(c.stdout, p.Narinfo)
	return exitOK
}

func cacheKeyCreate(c *adminCmd) int {
	pos := c.args
	var k struct {
		ID  string `json:"id"`
		Key string `json:"key"`
	}
	raw, ok := c.call("POST", "/api/v1/caches/"+seg(pos[0])+"/keys", nil, &k)
	if !ok {
		return exitFail
	}
	if c.json {
		return c.printJSON(raw)
	}
	fmt.Fprintf(c.stdout, "Created key %s for cache %s. It is shown only now:\n%s\n", k.ID, pos[0], k.Key)
	fmt.Fprintln(c.stdout, "Nix clients: a netrc line `machine HOST password KEY` (netrc-file); others: Authorization: Bearer KEY")
	return exitOK
}
