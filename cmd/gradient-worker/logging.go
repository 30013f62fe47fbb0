package main

import (
	"io"
	"log/slog"

	"gradient.dev/gradient/internal/envflag"
)

// newLogger is the process's structured logger on stderr.
func newLogger(opts options, stderr io.Writer) *slog.Logger {
	return envflag.NewLogger(opts.LogLevel, opts.LogFormat, stderr)
}
