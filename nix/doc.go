// Package nix runs the real Nix (2.8 and later) for fetching flakes,
// evaluating derivations, building, and reading and writing NARs.
//
// A *Nix value fixes the store (--store), NIX_CONFIG and environment for
// every call; each call takes a context and interrupts Nix when it ends.
// Files: config.go (runner, System, SystemFeatures), store.go (path info,
// validity, NAR dump, binary-cache copies), import.go (ImportNAR: a
// zstd NAR stream checked and streamed into the daemon), fetch.go (FetchFlake),
// eval.go + walker.nix (wildcard discovery, Instantiate), derivation.go
// (.drv files read through the daemon, DrvClosure), aterm.go (the .drv
// parser), build.go (Build and failure
// classification), buildhook.go (the build hook builds run with),
// errors.go (typed errors).
package nix
