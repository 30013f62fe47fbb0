package proxystore

import (
	"errors"
	"reflect"
	"testing"

	"gradient.dev/gradient/sealbox"
	"gradient.dev/gradient/storage/sqldb"
)

func testHetzner() HetznerConfig {
	return HetznerConfig{Enabled: true, MaxVMs: 3, SnapshotLabel: "gradient-worker",
		Systems: map[string]HetznerSystem{"x86_64-linux": {ServerType: "cx22", Location: "fsn1", Slots: 2}},
		SSHKeys: []int64{7}, Labels: map[string]string{"team": "ci"}, Allowed: Capabilities{Build: true}}
}

func TestHetznerConfig(t *testing.T) {
	t.Parallel()
	forEachEngine(t, func(t *testing.T, s *Store, _ string, _ *sealbox.Box) {
		ctx := t.Context()
		acme := mustTenant(t, s, "acme")
		if _, err := s.HetznerConfig(ctx, "acme"); !errors.Is(err, sqldb.ErrNotFound) {
			t.Fatalf("no configuration yet: %v", err)
		}
		set, err := s.SetHetznerConfig(ctx, "acme", testHetzner())
		if err != nil {
			t.Fatal(err)
		}
		want := testHetzner()
		want.TenantID, want.TenantName, want.UpdatedAt = acme.ID, "acme", set.UpdatedAt
		if !reflect.DeepEqual(set, want) {
			t.Fatalf("set %+v\nwant %+v", set, want)
		}
		c := testHetzner()
		c.SnapshotLabel, c.SnapshotID, c.Enabled = "", 99, false
		if set, err = s.SetHetznerConfig(ctx, acme.ID, c); err != nil || set.SnapshotID != 99 || set.Enabled {
			t.Fatalf("set again: %+v, %v", set, err)
		}
		all, err := s.HetznerConfigs(ctx)
		if err != nil || len(all) != 1 || all[0].TenantName != "acme" {
			t.Fatalf("HetznerConfigs = %+v, %v", all, err)
		}
		if _, err := s.SetHetznerConfig(ctx, "nobody", testHetzner()); !errors.Is(err, sqldb.ErrNotFound) {
			t.Fatalf("unknown tenant: %v", err)
		}
	})
}

func TestCheckHetznerConfig(t *testing.T) {
	t.Parallel()
	for name, change := range map[string]func(*HetznerConfig){
		"negative max":    func(c *HetznerConfig) { c.MaxVMs = -1 },
		"huge max":        func(c *HetznerConfig) { c.MaxVMs = MaxHetznerVMs + 1 },
		"no snapshot":     func(c *HetznerConfig) { c.SnapshotLabel = "" },
		"both snapshots":  func(c *HetznerConfig) { c.SnapshotID = 5 },
		"bad selector":    func(c *HetznerConfig) { c.SnapshotLabel = "a b" },
		"no systems":      func(c *HetznerConfig) { c.Systems = nil },
		"bad system":      func(c *HetznerConfig) { c.Systems = map[string]HetznerSystem{"x86": {ServerType: "cx22", Slots: 1}} },
		"bad server type": func(c *HetznerConfig) { c.Systems["x86_64-linux"] = HetznerSystem{ServerType: "CX 22", Slots: 1} },
		"zero slots":      func(c *HetznerConfig) { c.Systems["x86_64-linux"] = HetznerSystem{ServerType: "cx22"} },
		"bad location": func(c *HetznerConfig) {
			c.Systems["x86_64-linux"] = HetznerSystem{ServerType: "cx22", Location: "../x", Slots: 1}
		},
		"bad SSH key":       func(c *HetznerConfig) { c.SSHKeys = []int64{0} },
		"reserved label":    func(c *HetznerConfig) { c.Labels = map[string]string{"gradient-tenant": "x"} },
		"bad label value":   func(c *HetznerConfig) { c.Labels = map[string]string{"a": "-x"} },
		"nothing allowed":   func(c *HetznerConfig) { c.Allowed = Capabilities{} },
		"empty label key":   func(c *HetznerConfig) { c.Labels = map[string]string{"": "x"} },
		"label key newline": func(c *HetznerConfig) { c.Labels = map[string]string{"a\nb": "x"} },
	} {
		c := testHetzner()
		change(&c)
		if err := CheckHetznerConfig(c); !errors.Is(err, sqldb.ErrInvalid) {
			t.Errorf("%s: err = %v, want ErrInvalid", name, err)
		}
	}
	c := testHetzner()
	c.Enabled, c.Systems = false, nil
	if err := CheckHetznerConfig(c); err != nil {
		t.Errorf("a disabled configuration without systems: %v", err)
	}
	c = testHetzner()
	c.Labels = map[string]string{"example.com/owner": "a.b_c-1", "x": ""}
	if err := CheckHetznerConfig(c); err != nil {
		t.Errorf("prefixed label and empty value: %v", err)
	}
}
