package sources

import (
	"database/sql"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/beatd/beatd/config"
)

// TestDCBRowBounds: a django-celery-beat row becomes an entry document
// that config's one validator bounds like any other (issue 45): the
// merger parses it with ParseEntry, which refuses these with a pointer.
func TestDCBRowBounds(t *testing.T) {
	t.Parallel()
	interval := func(every int64, period string) dcbRow {
		return dcbRow{name: "row", task: "t", enabled: true, oneOff: false,
			every: sql.NullInt64{Int64: every, Valid: true}, period: sql.NullString{String: period, Valid: true}}
	}
	later := interval(5, "minutes")
	later.startTime = time.Date(2300, 1, 1, 0, 0, 0, 0, time.UTC)
	expiring := interval(5, "minutes")
	expiring.expires = "2300-01-01T00:00:00Z"
	tests := []struct {
		name    string
		row     dcbRow
		rowName string // "" is the row's
		pointer string
		want    string
	}{
		{name: "every 1 microsecond", row: interval(1, "microseconds"), pointer: "/every", want: "below the minimum interval"},
		{name: "every 200000 hours (23 years)", row: interval(200000, "hours"), pointer: "/every", want: "too long"},
		{name: "start_time in 2300", row: later, pointer: "/start_at", want: "outside the times beatd schedules"},
		{name: "expires in 2300", row: expiring, pointer: "/options/expires", want: "outside the times beatd schedules"},
		{name: "name of 201 characters", row: interval(5, "minutes"), rowName: strings.Repeat("n", 201), pointer: "", want: "the limit is 200"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			doc, err := tt.row.entry()
			if err != nil {
				t.Fatalf("entry: %v", err)
			}
			name := tt.row.name
			if tt.rowName != "" {
				name = tt.rowName
			}
			_, err = (*config.Config)(nil).ParseEntry(name, doc)
			var fe config.FieldErrors
			if !errors.As(err, &fe) || len(fe) != 1 || fe[0].Pointer != tt.pointer || !strings.Contains(fe[0].Message, tt.want) {
				t.Errorf("ParseEntry(%s): %v; want pointer %q and %q", doc, err, tt.pointer, tt.want)
			}
		})
	}
}
