package main

import (
	"fmt"
	"io"
	"time"

	"github.com/beatd/beatd/config"

	"github.com/beatd/beatd/schedule"
)

// printSolarNotes tells, for each solar entry, the days of the coming year
// on which its event does not occur (polar day or night): Celery 5.2.6's
// beat crashes there, beatd fires on the next day the event occurs.
func printSolarNotes(w io.Writer, cfg *config.Config, from time.Time) {
	for _, e := range cfg.Entries {
		s, ok := e.Schedule.(*schedule.Solar)
		if !ok {
			continue
		}
		for _, g := range s.PolarGaps(from, 366) {
			if g[1].IsZero() {
				fmt.Fprintf(w, "note: entry %q: no %s at %g, %g after %s\n", e.Name, s.Event, s.Lat, s.Lon, schedule.FormatSlot(g[0].In(e.Location)))
				continue
			}
			fmt.Fprintf(w, "note: entry %q: no %s at %g, %g between %s and %s (polar day or night); beatd fires at %s, the next time it occurs (Celery 5.2.6's beat crashes)\n",
				e.Name, s.Event, s.Lat, s.Lon, g[0].In(e.Location).Format(time.DateOnly), g[1].In(e.Location).Format(time.DateOnly),
				schedule.FormatSlot(g[1].In(e.Location)))
		}
	}
}
