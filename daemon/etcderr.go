package daemon

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
)

// Where names the etcd endpoints a command dials, for messages.
func (f *EtcdFlags) Where() string {
	eps := f.EndpointURLs()
	if len(eps) == 0 {
		eps = []string{defaultEtcdEndpoint}
	}
	return strings.Join(eps, ",")
}

// defaultEtcdEndpoint is where CLI commands look for etcd without
// --etcd-endpoints: the embedded etcd of `beatd run` on its default port.
const defaultEtcdEndpoint = "http://127.0.0.1:2379"

// Failure says which etcd a CLI command could not use and why, with
// the flag that points it elsewhere.
func (f *EtcdFlags) Failure(what string, timeout time.Duration, err error) error {
	if errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("%s: etcd at %s did not answer within %s (is etcd running there? set --etcd-endpoints or BEATD_ETCD_ENDPOINTS): %w",
			what, f.Where(), timeout, err)
	}
	return fmt.Errorf("%s: etcd at %s: %w", what, f.Where(), err)
}
