package main

import (
	"io"
	"log/slog"

	"gradient.dev/gradient/internal/servicecli"
)

// newLogger is the process's structured logger on stderr.
func newLogger(opts options, stderr io.Writer) *slog.Logger {
	return servicecli.NewLogger(opts.LogLevel, opts.LogFormat, stderr)
}
