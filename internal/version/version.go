// Package version is this build's version, set at build time: what
// `beatd version`, the replica's registration and beatd_build_info say.
package version

import (
	"runtime/debug"
)

// version is set at build time with
// -ldflags "-X github.com/beatd/beatd/internal/version.version=v1.2.3".
var version = ""

// String is this build's version: the one set at build time, else
// devel and the VCS revision.
func String() string {
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
