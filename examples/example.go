// Package examples ships the example flake that `gradient up` builds when
// it is given no flake of its own: a greeting, three derivations built
// from it in parallel and a report depending on all three, for
// x86_64-linux and aarch64-linux, with /bin/sh as the only builder and
// no inputs, so it builds offline without nixpkgs.
package examples

import _ "embed"

// FlakeNix is examples/flake/flake.nix.
//
//go:embed flake/flake.nix
var FlakeNix []byte

// FlakeAttrs are the example's packages, in build order: one root, three
// parallel derivations and the report.
var FlakeAttrs = []string{"greeting", "shout", "repeat", "count", "report"}
