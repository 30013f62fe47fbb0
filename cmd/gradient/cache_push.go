package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"strconv"
	"strings"
	"time"
)

// nixPathInfo is one entry of nix path-info --json.
type nixPathInfo struct {
	Path       string   `json:"path"`
	NarHash    string   `json:"narHash"`
	NarSize    int64    `json:"narSize"`
	References []string `json:"references"`
	Deriver    string   `json:"deriver"`
	CA         string   `json:"ca"`
}

// cachePush uploads store paths to a cache: nix path-info gives the
// metadata (hash, size, references, deriver, CA), nix store dump-path
// streams the NAR straight into the request body.
func cachePush(c *adminCmd) int {
	pos := c.args
	recursive, store := c.cmd.Bool("recursive"), c.cmd.String("store")
	infoArgs := []string{"path-info", "--json"}
	if recursive {
		infoArgs = append(infoArgs, "--recursive")
	}
	out, err := runNix(c.ctx, store, append(infoArgs, pos[1])...)
	if err != nil {
		fmt.Fprintf(c.stderr, "gradient %s: %v\n", c.name, err)
		return exitFail
	}
	var infos []nixPathInfo
	if err := json.Unmarshal(out, &infos); err != nil {
		fmt.Fprintf(c.stderr, "gradient %s: nix path-info: %v\n", c.name, err)
		return exitFail
	}
	for _, info := range infos {
		v, err := pushPath(c, store, pos[0], info)
		if err != nil {
			fmt.Fprintf(c.stderr, "gradient %s: %s: %v\n", c.name, info.Path, err)
			return exitFail
		}
		if c.json {
			j, _ := json.Marshal(v)
			fmt.Fprintf(c.stdout, "%s\n", j)
		} else if v.Created != nil && !*v.Created {
			fmt.Fprintf(c.stdout, "%s already in %s\n", v.StorePath, pos[0])
		} else {
			fmt.Fprintf(c.stdout, "Pushed %s (%d bytes, %d compressed)\n", v.StorePath, v.NarSize, v.FileSize)
		}
	}
	return exitOK
}

// runNix runs a nix command, with --store when store is set.
func runNix(ctx context.Context, store string, args ...string) ([]byte, error) {
	if store != "" {
		args = append(args, "--store", store)
	}
	args = append([]string{"--extra-experimental-features", "nix-command"}, args...)
	cmd := exec.CommandContext(ctx, "nix", args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("nix %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return out, nil
}

// pushPath streams one path's NAR to PUT /api/v1/caches/{cache}/paths.
func pushPath(c *adminCmd, store, cache string, info nixPathInfo) (cachePathInfo, error) {
	args := []string{"--extra-experimental-features", "nix-command", "store", "dump-path", info.Path}
	if store != "" {
		args = append(args, "--store", store)
	}
	dump := exec.CommandContext(c.ctx, "nix", args...)
	var dumpErr bytes.Buffer
	dump.Stderr = &dumpErr
	nar, err := dump.StdoutPipe()
	if err != nil {
		return cachePathInfo{}, err
	}
	if err := dump.Start(); err != nil {
		return cachePathInfo{}, fmt.Errorf("nix store dump-path: %w", err)
	}
	defer dump.Wait()
	req, err := http.NewRequestWithContext(c.ctx, "PUT", c.api.base+"/api/v1/caches/"+seg(cache)+"/paths", nar)
	if err != nil {
		return cachePathInfo{}, err
	}
	req.ContentLength = info.NarSize
	req.Header.Set("Authorization", "Bearer "+c.api.token)
	req.Header.Set("Content-Type", "application/x-nix-nar")
	req.Header.Set("X-Nix-Store-Path", info.Path)
	req.Header.Set("X-Nix-Nar-Hash", info.NarHash)
	req.Header.Set("X-Nix-Nar-Size", strconv.FormatInt(info.NarSize, 10))
	req.Header.Set("X-Nix-References", strings.Join(info.References, " "))
	req.Header.Set("X-Nix-Deriver", info.Deriver)
	req.Header.Set("X-Nix-CA", info.CA)
	if ttl := c.cmd.Duration("ttl"); ttl > 0 {
		req.Header.Set("X-Gradient-TTL", strconv.FormatInt(int64((ttl+time.Second-1)/time.Second), 10))
	}
	// No overall timeout: a NAR may take long; the context ends it.
	resp, err := c.api.http.Do(req)
	if err != nil {
		dump.Process.Kill()
		return cachePathInfo{}, fmt.Errorf("cannot reach the server: %w", err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return cachePathInfo{}, err
	}
	if resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusCreated {
		dump.Process.Kill() // an already-stored path is answered before the body is read
		return cachePathInfo{}, answerError(resp.StatusCode, raw)
	}
	var v cachePathInfo
	if err := json.Unmarshal(raw, &v); err != nil {
		return v, fmt.Errorf("unexpected answer from the server: %w", err)
	}
	if resp.StatusCode == http.StatusOK {
		io.Copy(io.Discard, nar) // let nix finish writing
	}
	return v, nil
}
