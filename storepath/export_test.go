package storepath

// NarStrings lets the external tests (ca_test.go, which runs the real
// Nix, whose package imports this one) build NARs by hand.
var NarStrings = narStrings
