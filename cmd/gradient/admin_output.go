package main

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

// table prints aligned columns with a header row.
func table(w io.Writer, header []string, rows [][]string) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, strings.Join(header, "\t"))
	for _, r := range rows {
		fmt.Fprintln(tw, strings.Join(r, "\t"))
	}
	tw.Flush()
}

// fields prints "label: value" lines with the values aligned.
func fields(w io.Writer, pairs ...string) {
	tw := tabwriter.NewWriter(w, 0, 0, 1, ' ', 0)
	for i := 0; i+1 < len(pairs); i += 2 {
		fmt.Fprintf(tw, "%s:\t%s\n", pairs[i], pairs[i+1])
	}
	tw.Flush()
}

// jobNames are the job kinds that are on, "none" when none is.
func jobNames(k jobKinds) string {
	var on []string
	for _, f := range []struct {
		on   bool
		name string
	}{{k.Fetch, "fetch"}, {k.Eval, "eval"}, {k.Build, "build"}} {
		if f.on {
			on = append(on, f.name)
		}
	}
	if len(on) == 0 {
		return "none"
	}
	return strings.Join(on, ",")
}

// orDash shows an empty value as "-" so table columns stay aligned.
func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func listOrDash(items []string) string { return orDash(strings.Join(items, ",")) }

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

func when(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.Local().Format("2006-01-02 15:04:05")
}

// humanBytes shows a byte count as 512 B, 12.0 KiB, 3.4 MiB or 1.2 GiB.
func humanBytes(n uint64) string {
	const unit = 1024
	if n < unit {
		return strconv.FormatUint(n, 10) + " B"
	}
	value, suffix := float64(n)/unit, "KiB"
	for _, next := range []string{"MiB", "GiB", "TiB"} {
		if value < unit {
			break
		}
		value, suffix = value/unit, next
	}
	return strconv.FormatFloat(value, 'f', 1, 64) + " " + suffix
}
