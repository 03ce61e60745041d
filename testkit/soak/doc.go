// Package soak measures a built beatd binary from the outside: it starts
// beatd (and, for comparison, celery beat) against its own redis-server,
// drains the Celery queue, and samples memory, CPU, etcd size and message
// lag over a run, so the same harness judges the code before and after a
// change. Of beatd's own packages it imports only testkit/harness, which
// runs the processes: none of the code it measures.
package soak
