package logbridge

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"math"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

func lines(t *testing.T, b *bytes.Buffer) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(b.String()), "\n") {
		if l == "" {
			continue
		}
		var v map[string]any
		if err := json.Unmarshal([]byte(l), &v); err != nil {
			t.Fatalf("not JSON: %q", l)
		}
		out = append(out, v)
	}
	return out
}

func TestZapToSlog(t *testing.T) {
	t.Parallel()
	var b bytes.Buffer
	log := slog.New(slog.NewJSONHandler(&b, &slog.HandlerOptions{Level: slog.LevelWarn}))
	z := Zap(log, "etcd", zapcore.DebugLevel).With(zap.String("member", "m1"))
	z.Info("dropped: below the slog level")
	z.Warn("slow fdatasync", zap.Duration("took", 1500*time.Millisecond), zap.Int("n", 3),
		zap.Error(errors.New("disk busy")), zap.Float64("ratio", math.Inf(1)), zap.Strings("peers", []string{"a", "b"}))
	z.Error("setting up serving from embedded etcd failed.")
	got := lines(t, &b)
	if len(got) != 2 {
		t.Fatalf("got %d lines, want 2: %s", len(got), b.String())
	}
	w := got[0]
	want := map[string]any{"level": "WARN", "msg": "slow fdatasync", "component": "etcd", "member": "m1", "took": "1.5s", "n": 3.0, "error": "disk busy", "ratio": "+Inf"}
	for k, v := range want {
		if w[k] != v {
			t.Errorf("%s = %#v, want %#v (line %v)", k, w[k], v, w)
		}
	}
	if got[1]["level"] != "ERROR" {
		t.Errorf("error line: %v", got[1])
	}
}

func TestZapMinLevel(t *testing.T) {
	t.Parallel()
	tests := []struct {
		level slog.Level
		want  []string
	}{
		{slog.LevelInfo, []string{"bad"}},
		{slog.LevelDebug, []string{"chatty", "bad"}}, // debugging shows warnings
	}
	for _, tt := range tests {
		var b bytes.Buffer
		log := slog.New(slog.NewJSONHandler(&b, &slog.HandlerOptions{Level: tt.level}))
		z := Zap(log, "etcd", zapcore.ErrorLevel)
		z.Info("noise")
		z.Warn("chatty")
		z.Error("bad")
		var got []string
		for _, l := range lines(t, &b) {
			got = append(got, l["msg"].(string))
		}
		if strings.Join(got, ",") != strings.Join(tt.want, ",") {
			t.Errorf("at %s: %v, want %v", tt.level, got, tt.want)
		}
	}
}

func TestRedisLogger(t *testing.T) {
	var b bytes.Buffer
	log := slog.New(slog.NewJSONHandler(&b, nil))
	SetRedisLogger(log)
	l := redisLogger{}
	l.Printf(context.Background(), "redis: %s:%d: connection pool: failed to dial\n", "pool.go", 770)
	got := lines(t, &b)
	if len(got) != 1 || got[0]["level"] != "WARN" || got[0]["component"] != "redis" || got[0]["msg"] != "redis: pool.go:770: connection pool: failed to dial" {
		t.Fatalf("got %v", got)
	}
}

func TestGRPCLogger(t *testing.T) {
	for _, tt := range []struct {
		level slog.Level
		want  []string
	}{
		{slog.LevelInfo, []string{"ERROR:e 2"}},
		{slog.LevelDebug, []string{"DEBUG:i 0", "WARN:w 1", "ERROR:e 2"}},
	} {
		var b bytes.Buffer
		SetGRPCLogger(slog.New(slog.NewJSONHandler(&b, &slog.HandlerOptions{Level: tt.level})))
		g := grpcLogger{}
		g.Infof("i %d", 0)
		g.Warningln("w", 1)
		g.Errorf("e %d\n", 2)
		var got []string
		for _, l := range lines(t, &b) {
			if l["component"] != "grpc" {
				t.Errorf("component %v", l["component"])
			}
			got = append(got, l["level"].(string)+":"+l["msg"].(string))
		}
		if strings.Join(got, ",") != strings.Join(tt.want, ",") {
			t.Errorf("at %s: %v, want %v", tt.level, got, tt.want)
		}
	}
}
