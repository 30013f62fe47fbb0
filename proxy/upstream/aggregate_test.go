package upstream

import (
	"math"
	"reflect"
	"slices"
	"testing"

	"gradient.dev/gradient/proxy/proxystore"
	"gradient.dev/gradient/wire"
)

func host(archs, features []string, slots, cpus uint32, ram uint64, score uint32) *wire.WorkerCapabilities {
	return &wire.WorkerCapabilities{Architectures: archs, SystemFeatures: features, MaxConcurrentBuilds: slots, CPUCount: cpus, RAMTotalMB: ram, CPUCoreScore: score}
}

func TestAggregate(t *testing.T) {
	build := wire.GradientCapabilities{Build: true}
	evalFetch := wire.GradientCapabilities{Eval: true, Fetch: true}
	empty := wire.WorkerCapabilities{Architectures: []string{}, SystemFeatures: []string{}}
	cases := []struct {
		name    string
		members []Member
		want    Hardware
	}{
		{"no workers", nil, Hardware{Host: empty}},
		{"only draining workers", []Member{{Capabilities: build, Host: host([]string{"x86_64-linux"}, nil, 4, 8, 1024, 9), Draining: true}},
			Hardware{Host: empty}},
		{
			"sums, unions, fastest core, OR'd capabilities",
			[]Member{
				{Capabilities: build, Host: host([]string{"x86_64-linux", "i686-linux"}, []string{"kvm"}, 4, 8, 16000, 300),
					Metrics: &wire.WorkerMetrics{CPUUsagePct: 50, RAMFreeMB: 1000}},
				{Capabilities: evalFetch, Host: host([]string{"aarch64-linux", "x86_64-linux"}, []string{"big-parallel", "kvm"}, 2, 24, 64000, 500),
					Metrics: &wire.WorkerMetrics{CPUUsagePct: 10, RAMFreeMB: 2000}},
				{Capabilities: wire.GradientCapabilities{Federate: true}, Host: host([]string{"riscv64-linux"}, nil, 9, 9, 9, 9999), Draining: true},
			},
			Hardware{
				Capabilities: wire.GradientCapabilities{Build: true, Eval: true, Fetch: true},
				Host: wire.WorkerCapabilities{Architectures: []string{"aarch64-linux", "i686-linux", "x86_64-linux"},
					SystemFeatures: []string{"big-parallel", "kvm"}, MaxConcurrentBuilds: 6, CPUCount: 32, RAMTotalMB: 80000, CPUCoreScore: 500},
				// (50·8 + 10·24) / 32
				Metrics: wire.WorkerMetrics{CPUUsagePct: 20, RAMFreeMB: 3000},
				Workers: 2,
			},
		},
		{
			"saturating sums",
			[]Member{
				{Host: host(nil, nil, math.MaxUint32-1, math.MaxUint32, math.MaxUint64-5, 1), Metrics: &wire.WorkerMetrics{RAMFreeMB: math.MaxUint64}},
				{Host: host(nil, nil, 2, 1, 10, 2), Metrics: &wire.WorkerMetrics{RAMFreeMB: 1}},
			},
			Hardware{Host: wire.WorkerCapabilities{Architectures: []string{}, SystemFeatures: []string{},
				MaxConcurrentBuilds: math.MaxUint32, CPUCount: math.MaxUint32, RAMTotalMB: math.MaxUint64, CPUCoreScore: 2},
				Metrics: wire.WorkerMetrics{RAMFreeMB: math.MaxUint64}, Workers: 2},
		},
		{
			"a usage that is no percentage is left out of the load",
			[]Member{
				{Host: host(nil, nil, 1, 4, 10, 1), Metrics: &wire.WorkerMetrics{CPUUsagePct: float32(math.NaN()), RAMFreeMB: 1}},
				{Host: host(nil, nil, 1, 4, 10, 1), Metrics: &wire.WorkerMetrics{CPUUsagePct: 1e9, RAMFreeMB: 1}},
				{Host: host(nil, nil, 1, 4, 10, 1), Metrics: &wire.WorkerMetrics{CPUUsagePct: 40, RAMFreeMB: 1}},
			},
			Hardware{Host: wire.WorkerCapabilities{Architectures: []string{}, SystemFeatures: []string{},
				MaxConcurrentBuilds: 3, CPUCount: 12, RAMTotalMB: 30, CPUCoreScore: 1},
				Metrics: wire.WorkerMetrics{CPUUsagePct: 40, RAMFreeMB: 3}, Workers: 3},
		},
		{
			"a worker without a host message counts its capabilities and load",
			[]Member{{Capabilities: evalFetch, Metrics: &wire.WorkerMetrics{CPUUsagePct: 30, RAMFreeMB: 5}}},
			Hardware{Capabilities: evalFetch, Host: empty, Metrics: wire.WorkerMetrics{CPUUsagePct: 30, RAMFreeMB: 5}, Workers: 1},
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := Aggregate(c.members); !reflect.DeepEqual(got, c.want) {
				t.Errorf("got  %+v\nwant %+v", got, c.want)
			}
		})
	}
}

// The union's order is the values', not the members': a pool listed in
// another order reports the same hardware.
func TestAggregateOrderIndependent(t *testing.T) {
	a := Member{Host: host([]string{"x86_64-linux", "aarch64-linux"}, []string{"kvm", "nixos-test"}, 1, 1, 1, 1)}
	b := Member{Host: host([]string{"riscv64-linux", "aarch64-linux"}, []string{"big-parallel"}, 1, 1, 1, 1)}
	ab, ba := Aggregate([]Member{a, b}), Aggregate([]Member{b, a})
	if !reflect.DeepEqual(ab, ba) {
		t.Fatalf("member order changed the aggregate:\n%+v\n%+v", ab, ba)
	}
	if want := []string{"aarch64-linux", "riscv64-linux", "x86_64-linux"}; !reflect.DeepEqual(ab.Host.Architectures, want) {
		t.Fatalf("architectures %v, want %v", ab.Host.Architectures, want)
	}
}

// Aggregate must not write into a member's slices (they are the
// downstream sessions' records).
func TestAggregateLeavesMembersAlone(t *testing.T) {
	archs := make([]string, 1, 8)
	archs[0] = "x86_64-linux"
	m := Member{Host: host(archs, nil, 1, 1, 1, 1)}
	Aggregate([]Member{m, {Host: host([]string{"aarch64-linux"}, nil, 1, 1, 1, 1)}})
	if len(m.Host.Architectures) != 1 || archs[:2][1] != "" {
		t.Fatalf("the member's architectures were modified: %v", archs[:2])
	}
}

// The systems a tenant's Hetzner workers can boot join the pool's
// architectures, sorted and without duplicates; slots stay the pool's.
func TestHardwareAddsBootableSystems(t *testing.T) {
	pool := poolOf{"t1": {{Capabilities: wire.GradientCapabilities{Build: true},
		Host: &wire.WorkerCapabilities{Architectures: []string{"x86_64-linux"}, MaxConcurrentBuilds: 2}}}}
	s, err := New(Config{Store: &proxystore.Store{}, Pool: pool, Bootable: func(id string) []string {
		if id == "t1" || id == "t2" {
			return []string{"aarch64-linux", "x86_64-linux"}
		}
		return nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	if h := s.Hardware("t1"); !slices.Equal(h.Host.Architectures, []string{"aarch64-linux", "x86_64-linux"}) || h.Host.MaxConcurrentBuilds != 2 {
		t.Fatalf("t1 reports %+v", h.Host)
	}
	if h := s.Hardware("t2"); !slices.Equal(h.Host.Architectures, []string{"aarch64-linux", "x86_64-linux"}) || h.Host.MaxConcurrentBuilds != 0 {
		t.Fatalf("t2 (no workers) reports %+v", h.Host)
	}
	if h := s.Hardware("t3"); len(h.Host.Architectures) != 0 {
		t.Fatalf("t3 (no Hetzner workers) reports %+v", h.Host)
	}
}

type poolOf map[string][]Member

func (p poolOf) Members(id string) []Member { return p[id] }
