package embedetcd

import (
	"cmp"
	"errors"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// storageErrnos are the errors of a data dir that cannot be written: the
// causes a storage exit names.
var storageErrnos = []syscall.Errno{syscall.ENOSPC, syscall.EROFS, syscall.EDQUOT, syscall.EIO, syscall.EACCES,
	syscall.EPERM, syscall.ENOTDIR, syscall.EISDIR, syscall.EFBIG}

// StorageCause is why err is a failure of the data dir ("no space left
// on device", "read-only file system", ...), and the file it concerns
// when err says; "" when err is no storage failure. etcd and bbolt wrap
// some errors with %v, so the text is read as well.
func StorageCause(err error) (cause, path string) {
	if err == nil {
		return "", ""
	}
	var pe *fs.PathError
	if errors.As(err, &pe) {
		path = pe.Path
	}
	var errno syscall.Errno
	if errors.As(err, &errno) {
		for _, e := range storageErrnos {
			if errno == e {
				return errno.Error(), path
			}
		}
	}
	text := err.Error()
	for _, e := range storageErrnos {
		if strings.Contains(text, e.Error()) {
			return e.Error(), path
		}
	}
	if pe != nil {
		return pe.Err.Error(), path
	}
	return "", ""
}

// Within reports whether path is dir or inside it.
func Within(path, dir string) bool {
	if a, err := filepath.Abs(path); err == nil {
		path = a
	}
	if a, err := filepath.Abs(dir); err == nil {
		dir = a
	}
	rel, err := filepath.Rel(dir, path)
	return err == nil && rel != ".." && !strings.HasPrefix(rel, "../")
}

// stopHook runs when etcd logs at fatal or panic level, which it does
// when it cannot write its WAL or backend: before etcd's own exit (or
// panic), beatd says in one ERROR line which data dir failed and why.
// etcd's lines name a file and an error, but no beatd line said why the
// process ended.
type stopHook struct {
	log     *slog.Logger
	dataDir string
	exit    func(code int)
	fatal   bool // Fatal (exit 1), else Panic (panic, as zap does)
}

func (h stopHook) OnWrite(ce *zapcore.CheckedEntry, fields []zapcore.Field) {
	var err error
	for _, f := range fields {
		if e, ok := f.Interface.(error); ok && f.Type == zapcore.ErrorType {
			err = e
			break
		}
	}
	cause, path := StorageCause(err)
	switch {
	case cause != "" && (path == "" || Within(path, h.dataDir)):
		h.log.Error("the embedded etcd cannot write its data dir: beatd stops", "data_dir", h.dataDir, "cause", cause,
			"path", path, "etcd", ce.Message, "err", err.Error())
	case h.fatal:
		what := ce.Message
		if err != nil {
			what = err.Error()
		}
		h.log.Error("the embedded etcd stopped on a fatal error: beatd stops", "data_dir", h.dataDir, "cause", what, "etcd", ce.Message)
	}
	if h.fatal {
		h.exit(1)
		return
	}
	panic(ce.Message)
}

// zapLogger is etcd's logger: its errors into beatd's log, and a beatd
// line naming the data dir before a fatal error ends the process.
func zapLogger(cfg *Config, core zapcore.Core) *zap.Logger {
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.NewJSONHandler(os.Stderr, nil))
	}
	exit := cfg.Exit
	if exit == nil {
		exit = os.Exit
	}
	h := stopHook{log: log, dataDir: cmp.Or(cfg.DataDir, cfg.Dir), exit: exit}
	p := h
	h.fatal = true
	return zap.New(core, zap.WithFatalHook(h), zap.WithPanicHook(p))
}
