package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
)

// endpointList names the etcd endpoints a command dials, for messages.
func (f *etcdFlags) endpointList() string {
	eps := f.endpoints()
	if len(eps) == 0 {
		eps = []string{defaultEtcdEndpoint}
	}
	return strings.Join(eps, ",")
}

// defaultEtcdEndpoint is where CLI commands look for etcd without
// --etcd-endpoints: the embedded etcd of `beatd run` on its default port.
const defaultEtcdEndpoint = "http://127.0.0.1:2379"

// etcdFailure says which etcd a CLI command could not use and why, with
// the flag that points it elsewhere.
func (f *etcdFlags) failure(what string, timeout time.Duration, err error) error {
	if errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("%s: etcd at %s did not answer within %s (is etcd running there? set --etcd-endpoints or BEATD_ETCD_ENDPOINTS): %w",
			what, f.endpointList(), timeout, err)
	}
	return fmt.Errorf("%s: etcd at %s: %w", what, f.endpointList(), err)
}
