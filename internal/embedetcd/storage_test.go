package embedetcd

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"runtime"
	"strings"
	"syscall"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// TestStorageCause: the cause of a storage failure is found through
// wrapping, %v included; other errors have none.
func TestStorageCause(t *testing.T) {
	t.Parallel()
	db := "/var/lib/beatd/etcd/member/snap/db"
	for _, tc := range []struct {
		name      string
		err       error
		wantCause string
		wantPath  string
	}{
		{name: "full disk", err: &fs.PathError{Op: "write", Path: db, Err: syscall.ENOSPC}, wantCause: "no space left on device", wantPath: db},
		{name: "read-only", err: &fs.PathError{Op: "open", Path: db, Err: syscall.EROFS}, wantCause: "read-only file system", wantPath: db},
		{name: "wrapped %w", err: fmt.Errorf("commit: %w", &fs.PathError{Op: "fsync", Path: db, Err: syscall.EIO}), wantCause: "input/output error", wantPath: db},
		{name: "wrapped %v", err: fmt.Errorf("wal: %v", &fs.PathError{Op: "write", Path: db, Err: syscall.EDQUOT}), wantCause: "disk quota exceeded"},
		{name: "bare errno", err: syscall.ENOSPC, wantCause: "no space left on device"},
		{name: "not storage", err: errors.New("raft: stopped")},
		{name: "nil", err: nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cause, path := StorageCause(tc.err)
			if cause != tc.wantCause || path != tc.wantPath {
				t.Errorf("StorageCause(%v) = %q, %q; want %q, %q", tc.err, cause, path, tc.wantCause, tc.wantPath)
			}
		})
	}
}

// TestStopHookNamesDataDir: when etcd logs a fatal error (what it does
// when it cannot write its WAL or backend), beatd's ERROR line names the
// data dir and the cause, and then the process exits with 1.
func TestStopHookNamesDataDir(t *testing.T) {
	t.Parallel()
	const dataDir = "/var/lib/beatd"
	for _, tc := range []struct {
		name      string
		msg       string
		err       error
		wantMsg   string
		wantCause string
	}{
		{name: "full disk", msg: "failed to commit tx", err: &fs.PathError{Op: "write", Path: dataDir + "/etcd/member/snap/db", Err: syscall.ENOSPC},
			wantMsg: "the embedded etcd cannot write its data dir: beatd stops", wantCause: "no space left on device"},
		{name: "read-only", msg: "failed to save Raft hard state and entries",
			err:     &fs.PathError{Op: "write", Path: dataDir + "/etcd/member/wal/0000000000000000-0000000000000000.wal", Err: syscall.EROFS},
			wantMsg: "the embedded etcd cannot write its data dir: beatd stops", wantCause: "read-only file system"},
		{name: "other fatal", msg: "failed to purge wal file", err: errors.New("wal: locked"),
			wantMsg: "the embedded etcd stopped on a fatal error: beatd stops", wantCause: "wal: locked"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var logs bytes.Buffer
			codes := make(chan int, 1)
			cfg := Config{Dir: dataDir + "/etcd", DataDir: dataDir, Logger: slog.New(slog.NewJSONHandler(&logs, nil)),
				Exit: func(code int) { codes <- code; runtime.Goexit() }}
			lg := zapLogger(&cfg, zapcore.NewNopCore())
			go lg.Fatal(tc.msg, zap.Error(tc.err))
			if code := <-codes; code != 1 {
				t.Errorf("exit %d, want 1", code)
			}
			var line map[string]any
			if err := json.Unmarshal(logs.Bytes(), &line); err != nil {
				t.Fatalf("want one JSON line: %v\n%s", err, logs.String())
			}
			for k, want := range map[string]string{"level": "ERROR", "msg": tc.wantMsg, "data_dir": dataDir, "cause": tc.wantCause, "etcd": tc.msg} {
				if line[k] != want {
					t.Errorf("%s = %v, want %q: %s", k, line[k], want, logs.String())
				}
			}
		})
	}
	t.Run("panic on storage", func(t *testing.T) {
		t.Parallel()
		var logs bytes.Buffer
		cfg := Config{Dir: dataDir + "/etcd", Logger: slog.New(slog.NewJSONHandler(&logs, nil)), Exit: func(int) { t.Error("exit on a panic") }}
		lg := zapLogger(&cfg, zapcore.NewNopCore())
		func() {
			defer func() {
				if recover() == nil {
					t.Error("etcd's Panic did not panic")
				}
			}()
			lg.Panic("failed to save snapshot", zap.Error(&fs.PathError{Op: "write", Path: dataDir + "/etcd/member/snap/x.snap", Err: syscall.ENOSPC}))
		}()
		if !strings.Contains(logs.String(), `"data_dir":"/var/lib/beatd/etcd"`) || !strings.Contains(logs.String(), `"cause":"no space left on device"`) {
			t.Errorf("want the data dir (Dir, with no DataDir) and the cause:\n%s", logs.String())
		}
	})
}
