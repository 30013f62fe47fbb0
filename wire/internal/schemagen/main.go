// Command schemagen keeps wire/schema/v{N}.txt in step with the code: it
// writes the file of every supported version that has none, deletes files
// below the oldest supported version, and refuses to rewrite a published
// file whose shape the code no longer matches.
//
// It runs from the wire package directory (go generate ./wire), after
// wiregen, so it sees the freshly generated code.
package main

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"

	"gradient.dev/gradient/wire"
)

func main() {
	if err := run("schema"); err != nil {
		fmt.Fprintln(os.Stderr, "schemagen:", err)
		os.Exit(1)
	}
}

var schemaFile = regexp.MustCompile(`^v(\d+)\.txt$`)

func run(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		m := schemaFile.FindStringSubmatch(e.Name())
		if m == nil {
			continue
		}
		ver, err := strconv.Atoi(m[1])
		if err != nil {
			return err
		}
		if ver < int(wire.OldestVersion) {
			fmt.Printf("schemagen: deleting %s: protocol %d is below the oldest supported version %d\n", e.Name(), ver, wire.OldestVersion)
			if err := os.Remove(filepath.Join(dir, e.Name())); err != nil {
				return err
			}
		}
	}
	for ver := wire.OldestVersion; ver <= wire.NewestVersion; ver++ {
		path := filepath.Join(dir, fmt.Sprintf("v%d.txt", ver))
		want := wire.Schema(ver)
		have, err := os.ReadFile(path)
		switch {
		case os.IsNotExist(err):
			fmt.Printf("schemagen: writing %s for the new protocol version %d\n", path, ver)
			if err := os.WriteFile(path, []byte(want), 0o644); err != nil {
				return err
			}
		case err != nil:
			return err
		case string(have) != want:
			return fmt.Errorf("%s no longer matches the code: protocol %d is published and its wire shape must not change. "+
				"Annotate the change instead (a new field with since=%d, a new variant, or a higher oldest) and run go generate again",
				path, ver, wire.NewestVersion+1)
		}
	}
	return nil
}
