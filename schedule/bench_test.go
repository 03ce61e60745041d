package schedule

import (
	"testing"
	"time"
)

var benchSink time.Time

func benchNext(b *testing.B, s Schedule) {
	t := time.Date(2026, 11, 30, 10, 7, 13, 0, time.UTC)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		benchSink = s.Next(t)
		t = t.Add(37 * time.Second)
	}
}

func BenchmarkNextCrontabUTC(b *testing.B) {
	benchNext(b, mustCrontab(b, "*/15", "*", "*", "*", "*", time.UTC))
}

func BenchmarkNextCrontabBerlinWeekdays(b *testing.B) {
	benchNext(b, mustCrontab(b, "30", "2", "mon-fri", "*", "*", mustLoc(b, "Europe/Berlin")))
}

func BenchmarkNextCrontabMonthly(b *testing.B) {
	benchNext(b, mustCrontab(b, "0", "9", "*", "1,15", "*", mustLoc(b, "America/New_York")))
}

func BenchmarkNextCron(b *testing.B) {
	c, err := ParseCron("15 3 * * 1-5", mustLoc(b, "Europe/Berlin"))
	if err != nil {
		b.Fatal(err)
	}
	benchNext(b, c)
}

func BenchmarkNextCronSeconds(b *testing.B) {
	c, err := ParseCron("*/10 * * * * *", time.UTC)
	if err != nil {
		b.Fatal(err)
	}
	benchNext(b, c)
}

func BenchmarkNextEvery(b *testing.B) {
	e, _ := NewEvery(30*time.Second, time.Time{})
	benchNext(b, e)
}
