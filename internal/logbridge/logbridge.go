// Package logbridge routes the logs of beatd's dependencies (the embedded
// etcd's zap logger, go-redis's printf logger, gRPC's logger) into beatd's
// slog logger, so one process writes one stream in one format, at one
// level.
package logbridge

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"os"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// Zap returns a zap logger that writes to log, with component set. Only
// entries at floor or above pass (etcd is chatty at info).
func Zap(log *slog.Logger, component string, floor zapcore.Level) *zap.Logger {
	return zap.New(ZapCore(log, component, floor))
}

// ZapCore is the zapcore.Core of Zap, for loggers built with options. A
// nil log writes JSON to stderr. When log is at debug level, warnings pass
// too, whatever min says: someone debugging wants etcd's warnings.
func ZapCore(log *slog.Logger, component string, floor zapcore.Level) zapcore.Core {
	if log == nil {
		log = slog.New(slog.NewJSONHandler(os.Stderr, nil))
	}
	if log.Enabled(context.Background(), slog.LevelDebug) {
		floor = min(floor, zapcore.WarnLevel)
	}
	return &zapCore{h: log.With("component", component).Handler(), min: floor}
}

type zapCore struct {
	h     slog.Handler
	min   zapcore.Level
	attrs []slog.Attr
}

func slogLevel(l zapcore.Level) slog.Level {
	switch {
	case l <= zapcore.DebugLevel:
		return slog.LevelDebug
	case l == zapcore.InfoLevel:
		return slog.LevelInfo
	case l == zapcore.WarnLevel:
		return slog.LevelWarn
	default:
		return slog.LevelError
	}
}

func (c *zapCore) Enabled(l zapcore.Level) bool {
	return l >= c.min && c.h.Enabled(context.Background(), slogLevel(l))
}

func (c *zapCore) With(fields []zapcore.Field) zapcore.Core {
	return &zapCore{h: c.h, min: c.min, attrs: append(append([]slog.Attr(nil), c.attrs...), attrs(fields)...)}
}

func (c *zapCore) Check(e zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if c.Enabled(e.Level) {
		return ce.AddCore(e, c)
	}
	return ce
}

func (c *zapCore) Write(e zapcore.Entry, fields []zapcore.Field) error {
	r := slog.NewRecord(e.Time, slogLevel(e.Level), e.Message, 0)
	r.AddAttrs(c.attrs...)
	if e.LoggerName != "" {
		r.AddAttrs(slog.String("logger", e.LoggerName))
	}
	r.AddAttrs(attrs(fields)...)
	return c.h.Handle(context.Background(), r)
}

func (c *zapCore) Sync() error { return nil }

// attrs converts zap fields through zap's map encoder, which knows every
// field type.
func attrs(fields []zapcore.Field) []slog.Attr {
	if len(fields) == 0 {
		return nil
	}
	enc := zapcore.NewMapObjectEncoder()
	for _, f := range fields {
		f.AddTo(enc)
	}
	out := make([]slog.Attr, 0, len(enc.Fields))
	for _, f := range fields { // in the order given
		if v, ok := enc.Fields[f.Key]; ok {
			out = append(out, slog.Any(f.Key, plain(v)))
			delete(enc.Fields, f.Key)
		}
	}
	return out
}

// plain makes a value JSON-safe: slog's JSON handler cannot encode NaN or
// infinities, and durations read better as strings.
func plain(v any) any {
	switch v := v.(type) {
	case float64:
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return fmt.Sprint(v)
		}
	case time.Duration:
		return v.String()
	case error:
		return v.Error()
	}
	return v
}

// SetRedisLogger sends go-redis's internal log lines (pool and
// reconnection errors) to log, at WARN, with component=redis. go-redis
// has one process-wide logger.
func SetRedisLogger(log *slog.Logger) {
	redis.SetLogger(redisLogger{log.With("component", "redis")})
}

type redisLogger struct{ log *slog.Logger }

func (l redisLogger) Printf(ctx context.Context, format string, v ...any) {
	if ctx == nil {
		ctx = context.Background()
	}
	l.log.WarnContext(ctx, strings.TrimSpace(fmt.Sprintf(format, v...)))
}
