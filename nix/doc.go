// Package nix runs the real Nix (2.8 and later) for fetching flakes,
// evaluating derivations, building, and reading and writing NARs.
package nix
