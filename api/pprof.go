package api

import (
	"net/http"
	"net/http/pprof"

	"github.com/beatd/beatd/auth"
)

// registerPprof serves Go's profiles under /debug/pprof/ to admin tokens:
// a CPU or heap profile of a leader with a million entries is how its
// start-up and memory are understood, and a profile can name entries'
// data (it is the process's memory), so it is not open.
func registerPprof(mux *http.ServeMux, c Config) {
	mux.HandleFunc("GET /debug/pprof/{what...}", c.need(auth.RoleAdmin, func(w http.ResponseWriter, r *http.Request, _ auth.Identity) {
		switch r.PathValue("what") {
		case "profile":
			pprof.Profile(w, r)
		case "trace":
			pprof.Trace(w, r)
		case "symbol":
			pprof.Symbol(w, r)
		case "cmdline":
			pprof.Cmdline(w, r)
		default:
			pprof.Index(w, r)
		}
	}))
}
