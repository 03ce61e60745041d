package keys

import "testing"

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
