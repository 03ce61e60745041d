package api

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/beatd/beatd/config"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// EtcdMaxRequestBytes is etcd's default --max-request-bytes (1.5 MiB),
// the embedded member's and an external etcd's unless raised: the
// largest request, a transaction with all its keys and values, it takes.
const EtcdMaxRequestBytes = 3 << 19

// etcdRefusal classifies an error from etcd (or the gRPC transport under
// it): too large, or a short public reason, so no gRPC text reaches a
// client; ok is false for an error that is not etcd's, whose message is
// beatd's own and may be shown.
func etcdRefusal(err error) (reason string, ok bool) {
	if errors.Is(err, rpctypes.ErrRequestTooLarge) || errors.Is(err, rpctypes.ErrGRPCRequestTooLarge) {
		return "", true
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return "etcd did not answer in time", true
	}
	if errors.Is(err, rpctypes.ErrNoSpace) || errors.Is(err, rpctypes.ErrGRPCNoSpace) {
		return "etcd is out of space (its --quota-backend-bytes)", true
	}
	var ee rpctypes.EtcdError
	if errors.As(err, &ee) {
		return "etcd refused the request", true
	}
	st, isStatus := status.FromError(err)
	if !isStatus {
		return "", false
	}
	switch st.Code() {
	case codes.ResourceExhausted:
		if strings.Contains(st.Message(), "larger than max") {
			return "", true // the gRPC transport's own size limit
		}
		return "etcd is overloaded", true
	case codes.Unavailable, codes.DeadlineExceeded, codes.Canceled:
		return "etcd is unavailable", true
	}
	return "etcd refused the request", true
}

// unavailable answers a backend failure: 413 when etcd refused the write
// for its size, else 503 with beatd's own message, or for an etcd error a
// short reason (the whole error goes to the log).
func (c Config) unavailable(w http.ResponseWriter, err error) {
	reason, fromEtcd := etcdRefusal(err)
	switch {
	case fromEtcd && reason == "":
		c.Logger.Warn("write too large for etcd", "err", err)
		tooLarge(w, fmt.Sprintf("the write is larger than etcd takes in one request (its --max-request-bytes, %s by default); send fewer or smaller entries at once", sizeText(EtcdMaxRequestBytes)), EtcdMaxRequestBytes)
	case fromEtcd:
		c.Logger.Error("API request failed in etcd", "err", err)
		writeError(w, http.StatusServiceUnavailable, "", reason+"; the replica's log has the error")
	default:
		c.Logger.Error("API request failed", "err", err)
		writeError(w, http.StatusServiceUnavailable, "", err.Error())
	}
}

// tooLarge answers 413 with the limit in bytes (max_bytes), so a client
// can split what it sends.
func tooLarge(w http.ResponseWriter, msg string, limit int64) {
	writeJSON(w, http.StatusRequestEntityTooLarge, struct {
		apiError
		MaxBytes int64 `json:"max_bytes"`
	}{apiError{Errors: []config.FieldError{{Pointer: "", Message: msg}}}, limit})
}

// sizeText is n bytes for people: "1 MiB", "64 KiB", "1.5 MiB".
func sizeText(n int64) string {
	switch {
	case n >= 1<<20 && n%(1<<19) == 0:
		return strings.TrimSuffix(fmt.Sprintf("%.1f", float64(n)/(1<<20)), ".0") + " MiB"
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%d KiB", n>>10)
	}
	return fmt.Sprintf("%d bytes", n)
}
