package config

import (
	"strings"
	"testing"
	"time"

	"github.com/beatd/beatd/schedule"
)

func TestConfigRelativeAndDays(t *testing.T) {
	cfg, err := Parse("s.yaml", []byte("entries:\n  a: {task: t, every: 1d, relative: true, catchup_window: 1w, jitter: 1d, options: {expires: 2d}}\n  b: {task: t, every: 1w}\n"))
	if err != nil {
		t.Fatal(err)
	}
	a := cfg.Entry("a")
	if ev := a.Schedule.(*schedule.Every); !ev.Relative || ev.Interval != 24*time.Hour {
		t.Errorf("a = %+v", ev)
	}
	if a.CatchupWindow != 7*24*time.Hour || a.Jitter != 24*time.Hour || a.Options.Expires.After != 48*time.Hour {
		t.Errorf("durations with d and w: %s %s %s", a.CatchupWindow, a.Jitter, a.Options.Expires.After)
	}
	if ev := cfg.Entry("b").Schedule.(*schedule.Every); ev.Relative || ev.Interval != 7*24*time.Hour {
		t.Errorf("b = %+v", ev)
	}
	_, err = Parse("s.yaml", []byte("entries:\n  a: {task: t, cron: '* * * * *', relative: true}\n"))
	if err == nil || !strings.Contains(err.Error(), "s.yaml:2:35: entry \"a\": relative applies only to every") {
		t.Errorf("relative on cron: %v", err)
	}
}
