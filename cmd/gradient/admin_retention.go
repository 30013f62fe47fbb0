package main

import (
	"fmt"
	"gradient.dev/gradient/server/adminapi"
	"strconv"

	"github.com/urfave/cli/v3"
)

// Retention and garbage collection: gradient cache gc, cache retention,
// eval pin/unpin, project retention.

func (a *app) cacheGCCommands() []*cli.Command {
	return []*cli.Command{
		a.adminLeaf("gc", "collect the caches' garbage now and print what it freed (--dry-run: what it would free)", nil, []cli.Flag{
			&cli.BoolFlag{Name: "dry-run", Usage: "delete nothing; list exactly what a collection would delete"},
		}, cacheGC),
		a.adminLeaf("retention", "show or set the cache's size cap (least recently served unprotected paths go first above it)", []string{"CACHE"}, []cli.Flag{
			&cli.Int64Flag{Name: "max-bytes", Usage: "cap the cache at `BYTES` (compressed NARs)"},
			&cli.BoolFlag{Name: "no-cap", Usage: "remove the size cap"},
		}, cacheRetention),
	}
}

func (a *app) evalPinCommands() []*cli.Command {
	return []*cli.Command{
		a.adminLeaf("pin", "keep the evaluation (outputs, closures, .drv files, source, logs) whatever its age", []string{"EVAL_ID"}, nil, evalPin(true)),
		a.adminLeaf("unpin", "let retention drop the evaluation again once it is old", []string{"EVAL_ID"}, nil, evalPin(false)),
	}
}

func (a *app) projectRetentionCommand() *cli.Command {
	return a.adminLeaf("retention", "show or set how many of the project's newest evaluations are kept", []string{"PROJECT"}, []cli.Flag{
		&cli.IntFlag{Name: "keep-evaluations", Usage: "keep the newest `N` evaluations"},
		&cli.BoolFlag{Name: "default", Usage: "use the server's --keep-evaluations again"},
	}, projectRetention)
}

type (
	gcPath   = adminapi.GCPath
	gcReport = adminapi.GCReport
)

func cacheGC(c *adminCmd) int {
	dry := c.cmd.Bool("dry-run")
	var rep gcReport
	raw, ok := c.call("POST", "/api/v1/gc?dry_run="+strconv.FormatBool(dry), nil, &rep)
	if !ok {
		return exitFail
	}
	if c.json {
		return c.printJSON(raw)
	}
	verb := "Deleted"
	if dry {
		verb = "Would delete"
	}
	for _, p := range rep.Paths {
		fmt.Fprintf(c.stdout, "%s %s (%s, %s)\n", verb, p.StorePath, humanBytes(uint64(max(p.FileSize, 0))), p.Reason)
	}
	if rep.Truncated {
		fmt.Fprintln(c.stdout, "(list cut short; the totals are complete)")
	}
	fmt.Fprintf(c.stdout, "%s %d paths and %d NAR objects (%s); job logs of %d evaluations (%s)\n", verb,
		rep.PathsFreed, rep.ObjectsFreed, humanBytes(uint64(max(rep.BytesFreed, 0))),
		rep.LogsPruned, humanBytes(uint64(max(rep.LogBytes, 0))))
	fmt.Fprintf(c.stdout, "Kept: %d paths of kept evaluations, %d pushed, %d recent\n",
		rep.Protected["evaluation"], rep.Protected["pushed"], rep.Protected["recent"])
	return exitOK
}

func cacheRetention(c *adminCmd) int {
	method, body := "GET", map[string]any(nil)
	switch {
	case c.cmd.Bool("no-cap") && c.cmd.IsSet("max-bytes"):
		fmt.Fprintf(c.stderr, "gradient %s: --max-bytes and --no-cap exclude each other\n", c.name)
		return exitUsage
	case c.cmd.Bool("no-cap"):
		method, body = "PUT", map[string]any{"max_bytes": nil}
	case c.cmd.IsSet("max-bytes"):
		method, body = "PUT", map[string]any{"max_bytes": c.cmd.Int64("max-bytes")}
	}
	var v struct {
		MaxBytes *int64 `json:"max_bytes"`
	}
	raw, ok := c.call(method, "/api/v1/caches/"+seg(c.args[0])+"/retention", body, &v)
	if !ok {
		return exitFail
	}
	if c.json {
		return c.printJSON(raw)
	}
	if v.MaxBytes == nil {
		fmt.Fprintf(c.stdout, "%s: no size cap\n", c.args[0])
	} else {
		fmt.Fprintf(c.stdout, "%s: size cap %d bytes (%s)\n", c.args[0], *v.MaxBytes, humanBytes(uint64(*v.MaxBytes)))
	}
	return exitOK
}

func evalPin(pinned bool) func(*adminCmd) int {
	return func(c *adminCmd) int {
		method := "PUT"
		if !pinned {
			method = "DELETE"
		}
		raw, ok := c.call(method, "/api/v1/evaluations/"+seg(c.args[0])+"/pin", nil, nil)
		if !ok {
			return exitFail
		}
		if c.json {
			return c.printJSON(raw)
		}
		if pinned {
			fmt.Fprintf(c.stdout, "Pinned evaluation %s: retention keeps it\n", c.args[0])
		} else {
			fmt.Fprintf(c.stdout, "Unpinned evaluation %s\n", c.args[0])
		}
		return exitOK
	}
}

func projectRetention(c *adminCmd) int {
	method, body := "GET", map[string]any(nil)
	switch {
	case c.cmd.Bool("default") && c.cmd.IsSet("keep-evaluations"):
		fmt.Fprintf(c.stderr, "gradient %s: --keep-evaluations and --default exclude each other\n", c.name)
		return exitUsage
	case c.cmd.Bool("default"):
		method, body = "PUT", map[string]any{"keep_evaluations": nil}
	case c.cmd.IsSet("keep-evaluations"):
		method, body = "PUT", map[string]any{"keep_evaluations": c.cmd.Int("keep-evaluations")}
	}
	var v struct {
		KeepEvaluations *int `json:"keep_evaluations"`
	}
	raw, ok := c.call(method, "/api/v1/projects/"+seg(c.args[0])+"/retention", body, &v)
	if !ok {
		return exitFail
	}
	if c.json {
		return c.printJSON(raw)
	}
	if v.KeepEvaluations == nil {
		fmt.Fprintf(c.stdout, "%s: keeps the server's default number of evaluations\n", c.args[0])
	} else {
		fmt.Fprintf(c.stdout, "%s: keeps its newest %d evaluations\n", c.args[0], *v.KeepEvaluations)
	}
	return exitOK
}
