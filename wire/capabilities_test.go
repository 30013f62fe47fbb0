package wire

import (
	"reflect"
	"strings"
	"testing"
)

// Every capability's name is its wire field name, and a name read back is
// the same single capability.
func TestCapabilityNames(t *testing.T) {
	typ := reflect.TypeOf(GradientCapabilities{})
	if typ.NumField() != len(capabilityNames) {
		t.Fatalf("GradientCapabilities has %d fields, %d names", typ.NumField(), len(capabilityNames))
	}
	var all GradientCapabilities
	for i := range typ.NumField() {
		tag, _, _ := strings.Cut(typ.Field(i).Tag.Get("wire"), ",")
		one, ok := CapabilityNamed(tag)
		if !ok {
			t.Fatalf("CapabilityNamed(%q) unknown", tag)
		}
		if got := one.Names(); !reflect.DeepEqual(got, []string{tag}) {
			t.Errorf("CapabilityNamed(%q).Names() = %v", tag, got)
		}
		if !reflect.ValueOf(one).Field(i).Bool() {
			t.Errorf("CapabilityNamed(%q) does not set field %s", tag, typ.Field(i).Name)
		}
		all = all.Or(one)
	}
	if got, want := all.Names(), []string{"core", "federate", "fetch", "eval", "build", "cache"}; !reflect.DeepEqual(got, want) {
		t.Errorf("all names = %v, want %v", got, want)
	}
	if got := (GradientCapabilities{}).Names(); got != nil {
		t.Errorf("no capability: Names() = %v, want nil", got)
	}
	for _, bad := range []string{"", "Fetch", " fetch", "builds"} {
		if c, ok := CapabilityNamed(bad); ok || c != (GradientCapabilities{}) {
			t.Errorf("CapabilityNamed(%q) = %+v, %v", bad, c, ok)
		}
	}
}
