package schedule

import (
	"testing"
	"time"
)

func TestDescribe(t *testing.T) {
	ny, _ := time.LoadLocation("America/New_York")
	berlin, _ := time.LoadLocation("Europe/Berlin")
	crontab := func(spec string, loc *time.Location) Schedule {
		c, err := ParseCrontab(spec, loc)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	cron := func(spec string, loc *time.Location) Schedule {
		c, err := ParseCron(spec, loc)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	tests := []struct {
		s    Schedule
		want string
	}{
		{&Every{Interval: 5 * time.Second}, "every 5 s"},
		{&Every{Interval: 90 * time.Minute}, "every 1 h 30 min"},
		{&Every{Interval: 500 * time.Millisecond}, "every 500 ms"},
		{&At{Time: time.Date(2026, 12, 24, 18, 0, 0, 0, berlin)}, "once at 2026-12-24 18:00:00 +01:00"},
		{crontab("30 2 * * mon-fri", ny), "at 02:30 Mon–Fri (America/New_York)"},
		{crontab("*/15 * * * *", time.UTC), "every 15 min (UTC)"},
		{crontab("* * * * *", time.UTC), "every minute (UTC)"},
		{crontab("0 9,17 1,15 * *", berlin), "at 09:00, 17:00 on day 1, 15 (Europe/Berlin)"},
		{crontab("0 0 * 1,7 sat,sun", time.UTC), "at 00:00 Sun, Sat in Jan, Jul (UTC)"},
		{crontab("0 0 1-7 * mon", time.UTC), "at 00:00 on day 1–7 if Mon (UTC)"},
		{crontab("5 * * * *", time.UTC), "hourly at :05 (UTC)"},
		{cron("15 3 * * 1-5", berlin), "at 03:15 Mon–Fri (Europe/Berlin)"},
		{cron("0 0 1 * mon", time.UTC), "at 00:00 on day 1 or Mon (UTC)"},
		{cron("*/10 * * * * *", time.UTC), "every 10 s (UTC)"},
		{cron("@hourly", time.UTC), "hourly at :00 (UTC)"},
	}
	for _, tt := range tests {
		t.Run(tt.want, func(t *testing.T) {
			if got := Describe(tt.s); got != tt.want {
				t.Errorf("Describe(%v) = %q, want %q", tt.s, got, tt.want)
			}
		})
	}
}
