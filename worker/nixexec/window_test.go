package nixexec

import (
	"bytes"
	"context"
	"crypto/sha256"
	"reflect"
	"testing"

	"gradient.dev/gradient/internal/nixtest"
	"gradient.dev/gradient/internal/zstdbound/zstdboundtest"
	"gradient.dev/gradient/nix"
	"gradient.dev/gradient/nixbase32"
	"gradient.dev/gradient/wire"
)

// A pulled object whose zstd frame declares a window beyond the bound
// fails the real import, and the pull reports the path InputsUnavailable
// (the server demotes the object), not a transient failure to retry.
func TestPulledWindowBeyondTheBoundIsInputsUnavailable(t *testing.T) {
	n := nixtest.New(t)
	n.ImportUnsigned = true // the window, not the signature, is what this test refuses
	nar := []byte("not read: the frame is refused first")
	sum := sha256.Sum256(nar)
	path := "/nix/store/" + nixbase32.Encode(sum[:20]) + "-wide-window"
	it := nix.NarImport{StorePath: path, NarHash: "sha256:" + nixbase32.Encode(sum[:]), NarSize: int64(len(nar))}
	err := n.ImportNAR(context.Background(), it, bytes.NewReader(zstdboundtest.WithWindowLog(28, nar)))
	je := jobError(t, classifyPull(context.Background(), path, err), wire.FailureInputsUnavailable)
	if !reflect.DeepEqual(je.MissingPaths, []string{path}) {
		t.Errorf("missing paths %v, want [%s]", je.MissingPaths, path)
	}
}
