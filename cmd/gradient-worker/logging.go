package main

import (
	"io"
	"log/slog"
)

// newLogger is the process's structured logger on stderr.
func newLogger(opts options, stderr io.Writer) *slog.Logger {
	h := &slog.HandlerOptions{Level: opts.LogLevel}
	if opts.LogFormat == "json" {
		return slog.New(slog.NewJSONHandler(stderr, h))
	}
	return slog.New(slog.NewTextHandler(stderr, h))
}
