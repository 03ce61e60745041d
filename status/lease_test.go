package status

import "testing"

func TestLeaseLapsing(t *testing.T) {
	t.Parallel()
	tests := []struct {
		remaining, granted int64
		want               bool
	}{
		{6, 6, false}, {4, 6, false}, {3, 6, false}, {2, 6, true}, {0, 6, true},
		{5, 5, false}, {3, 5, false}, {2, 5, false}, {1, 5, true},
		{2, 2, false}, {1, 2, false}, {0, 2, false},
		{10, 10, false}, {6, 10, false}, {4, 10, true},
	}
	for _, tt := range tests {
		if got := leaseLapsing(tt.remaining, tt.granted); got != tt.want {
			t.Errorf("leaseLapsing(%d of %d) = %v, want %v", tt.remaining, tt.granted, got, tt.want)
		}
	}
}
