// Command wiregen generates the encoder, decoder and schema describer of the
// wire package from the //wire: annotations next to its Go types.
//
// It runs from the package directory (go generate ./wire) and writes
// wire_gen.go there. It never reads the generated file.
package main

import (
	"fmt"
	"go/format"
	"os"
	"path/filepath"
)

func main() {
	if err := run(mustGetwd()); err != nil {
		fmt.Fprintln(os.Stderr, "wiregen:", err)
		os.Exit(1)
	}
}

func run(dir string) error {
	m, err := load(dir)
	if err != nil {
		return err
	}
	src, err := emit(m)
	if err != nil {
		return err
	}
	out, err := formatSource(src)
	if err != nil {
		os.WriteFile(filepath.Join(dir, "wire_gen.go.broken"), src, 0o644)
		return fmt.Errorf("generated code does not format (see wire_gen.go.broken): %w", err)
	}
	return os.WriteFile(filepath.Join(dir, "wire_gen.go"), out, 0o644)
}

func formatSource(src []byte) ([]byte, error) { return format.Source(src) }
