package daemon

import (
	"runtime"
	"sync"

	"golang.org/x/sys/unix"
)

// backgroundNice is the nice value of the thread that runs a shard
// load's parse. On a busy host (the bench's 2 cores carry etcd, Redis and
// four replicas) a load's parse took the CPU that another shard's term
// start or a leader's publishes needed, and a move's start ran ten times
// its time alone. At +10 the kernel gives the parse about a tenth of what
// a default thread gets when they contend, and all of an idle CPU.
const backgroundNice = 10

// background is the process's one low-priority worker (inBackground).
var background struct {
	once sync.Once
	work chan func()
}

// inBackground runs fn on the process's background thread, at
// backgroundNice, and waits for it; calls take turns. Go has no
// per-goroutine priority, so one goroutine is locked to a thread of its
// own for the life of the process, and that thread alone is lowered.
// It never exits, on purpose: a thread's nice cannot be raised back
// without CAP_SYS_NICE, so the thread could not go back to the pool, and
// a locked goroutine that exits takes its thread down, which kills any
// child process that thread started with Pdeathsig (the test harness's
// servers, started from beatd's own test processes). What fn starts in
// other goroutines, and the GC's workers, run at the default priority.
func inBackground(fn func()) {
	background.once.Do(func() {
		background.work = make(chan func())
		go backgroundWorker(background.work)
	})
	done := make(chan struct{})
	background.work <- func() {
		defer close(done)
		fn()
	}
	<-done
}

func backgroundWorker(work <-chan func()) {
	runtime.LockOSThread() // never unlocked (inBackground)
	// A failure leaves the thread at the default priority: the work is
	// the same, only less polite.
	_ = unix.Setpriority(unix.PRIO_PROCESS, unix.Gettid(), backgroundNice)
	for fn := range work {
		fn()
	}
}
