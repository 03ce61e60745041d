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
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"google.golang.org/grpc/grpclog"
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

// go-redis and gRPC each have one process-wide logger, which they read
// without a lock: setting it while a client runs is a data race (and two
// daemons in one test process do). So the bridges are installed once,
// before any client exists, and forward to a logger swapped atomically.
func init() {
	redis.SetLogger(redisLogger{})
	grpclog.SetLoggerV2(grpcLogger{})
}

var (
	redisTarget atomic.Pointer[slog.Logger]
	grpcTarget  atomic.Pointer[grpcSink]
)

// SetRedisLogger sends go-redis's internal log lines (pool and
// reconnection errors) to log, at WARN, with component=redis. go-redis
// has one process-wide logger.
func SetRedisLogger(log *slog.Logger) {
	redisTarget.Store(log.With("component", "redis"))
}

type redisLogger struct{}

func (redisLogger) Printf(ctx context.Context, format string, v ...any) {
	if ctx == nil {
		ctx = context.Background()
	}
	log := redisTarget.Load()
	if log == nil {
		log = slog.Default().With("component", "redis")
	}
	log.WarnContext(ctx, strings.TrimSpace(fmt.Sprintf(format, v...)))
}

// SetGRPCLogger sends gRPC's log (the etcd client's transport) to log with
// component=grpc: errors, as gRPC's default logger prints, and at debug
// level its warnings and info too (info as debug). gRPC has one
// process-wide logger; the last call wins, safely at any time.
func SetGRPCLogger(log *slog.Logger) {
	grpcTarget.Store(&grpcSink{log: log.With("component", "grpc"), debug: log.Enabled(context.Background(), slog.LevelDebug)})
}

type grpcSink struct {
	log   *slog.Logger
	debug bool
}

func currentGRPC() *grpcSink {
	if t := grpcTarget.Load(); t != nil {
		return t
	}
	return &grpcSink{log: slog.Default().With("component", "grpc")}
}

// grpcLogger is the bridge gRPC holds; it writes to the current sink.
type grpcLogger struct{}

func (grpcLogger) emit(level slog.Level, msg string) {
	g := currentGRPC()
	if level < slog.LevelError && !g.debug {
		return // a dial retry is a warning each time: beatd reports outages itself
	}
	if level == slog.LevelInfo {
		level = slog.LevelDebug // gRPC's info is chatter
	}
	g.log.Log(context.Background(), level, strings.TrimSpace(msg))
}

func (g grpcLogger) Info(args ...any)   { g.emit(slog.LevelInfo, fmt.Sprint(args...)) }
func (g grpcLogger) Infoln(args ...any) { g.emit(slog.LevelInfo, fmt.Sprintln(args...)) }
func (g grpcLogger) Infof(format string, args ...any) {
	g.emit(slog.LevelInfo, fmt.Sprintf(format, args...))
}
func (g grpcLogger) Warning(args ...any)   { g.emit(slog.LevelWarn, fmt.Sprint(args...)) }
func (g grpcLogger) Warningln(args ...any) { g.emit(slog.LevelWarn, fmt.Sprintln(args...)) }
func (g grpcLogger) Warningf(format string, args ...any) {
	g.emit(slog.LevelWarn, fmt.Sprintf(format, args...))
}
func (g grpcLogger) Error(args ...any)   { g.emit(slog.LevelError, fmt.Sprint(args...)) }
func (g grpcLogger) Errorln(args ...any) { g.emit(slog.LevelError, fmt.Sprintln(args...)) }
func (g grpcLogger) Errorf(format string, args ...any) {
	g.emit(slog.LevelError, fmt.Sprintf(format, args...))
}

// Fatal logs, then exits as gRPC's own logger does.
func (g grpcLogger) Fatal(args ...any) { g.emit(slog.LevelError, fmt.Sprint(args...)); os.Exit(1) }
func (g grpcLogger) Fatalln(args ...any) {
	g.emit(slog.LevelError, fmt.Sprintln(args...))
	os.Exit(1)
}
func (g grpcLogger) Fatalf(format string, args ...any) {
	g.emit(slog.LevelError, fmt.Sprintf(format, args...))
	os.Exit(1)
}

// V reports whether verbosity level l is logged: only at debug, level 0.
func (grpcLogger) V(l int) bool { return currentGRPC().debug && l <= 0 }
