package daemon

import (
	"runtime/debug"
)

// version is set at build time with
// -ldflags "-X github.com/beatd/beatd/daemon.version=v1.2.3".
var version = ""

// Version is this build's version: the one set at build time, else
// devel and the VCS revision.
func Version() string {
	v := version
	if v == "" {
		v = "devel"
		if bi, ok := debug.ReadBuildInfo(); ok {
			for _, s := range bi.Settings {
				if s.Key == "vcs.revision" && len(s.Value) >= 12 {
					v = "devel-" + s.Value[:12]
				}
			}
		}
	}
	return v
}
