package keys

import (
	"strings"
	"testing"
)

func TestLayout(t *testing.T) {
	for _, tc := range []struct{ in, prefix, leaders, cluster string }{
		{"", "/beatd/default/", "/beatd/default/leader/", "beatd/default"},
		{"/beatd/a", "/beatd/a/", "/beatd/a/leader/", "beatd/a"},
		{"/x/", "/x/", "/x/leader/", "x"},
	} {
		p := Prefix(tc.in)
		if p != tc.prefix || Leaders(p) != tc.leaders || Cluster(p) != tc.cluster {
			t.Errorf("%q: prefix %q leaders %q cluster %q", tc.in, p, Leaders(p), Cluster(p))
		}
	}
	if State("/p/") == Requests("/p/") || State("/p/") == LegacyEntries("/p/") {
		t.Error("two kinds of keys share a prefix")
	}
}

func TestShards(t *testing.T) {
	for _, tc := range []struct {
		name      string
		i, n      int
		want      string
		wantState string
	}{
		{name: "one shard is the cluster", i: 0, n: 1, want: "/p/", wantState: "/p/state/"},
		{name: "shard 0 of 4", i: 0, n: 4, want: "/p/shards/0/", wantState: "/p/shards/0/state/"},
		{name: "shard 3 of 4", i: 3, n: 4, want: "/p/shards/3/", wantState: "/p/shards/3/state/"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Shard("/p/", tc.i, tc.n)
			if got != tc.want || State(got) != tc.wantState {
				t.Errorf("Shard = %q, State = %q; want %q, %q", got, State(got), tc.want, tc.wantState)
			}
		})
	}
	if ShardCount("/p/") == Shard("/p/", 0, 2) || Election(Shard("/p/", 1, 2)) == Election("/p/") {
		t.Error("a shard's keys collide with the cluster's")
	}
	// A resize's keys all lie under Resize (replicas refuse to start
	// while any does), and its staging table under none of the shards'.
	for _, k := range []string{ResizeLock("/p/"), ResizePlan("/p/"), State(ResizeStaging("/p/"))} {
		if !strings.HasPrefix(k, Resize("/p/")) || strings.HasPrefix(k, Shards("/p/")) || strings.HasPrefix(k, State("/p/")) {
			t.Errorf("resize key %s: want it under %s only", k, Resize("/p/"))
		}
	}
	// The assignment is fnv32a(name) mod n, fixed: values from Go's
	// hash/fnv, which every replica (and testkit/shardsim) uses.
	for _, tc := range []struct {
		name string
		n    int
		want int
	}{
		{"anything", 1, 0},
		{"tenant-000", 8, ShardOfRef("tenant-000") % 8},
		{"a", 4, 0xe40c292c % 4},
	} {
		if got := ShardOf(tc.name, tc.n); got != tc.want {
			t.Errorf("ShardOf(%q, %d) = %d, want %d", tc.name, tc.n, got, tc.want)
		}
	}
}

// ShardOfRef is FNV-1a 32 written out (offset basis 2166136261, prime
// 16777619), to check ShardOf against the algorithm rather than itself.
func ShardOfRef(s string) int {
	h := uint32(2166136261)
	for i := 0; i < len(s); i++ {
		h ^= uint32(s[i])
		h *= 16777619
	}
	return int(h)
}
