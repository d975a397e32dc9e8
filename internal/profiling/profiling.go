// Package profiling serves Go's profiles over HTTP, for the programs'
// --profiling flags (tabbyd, tabby-scheduler-extender).
package profiling

import (
	"net/http"
	"net/http/pprof"
)

// Register adds Go's CPU, heap, goroutine and other profiles and the
// execution trace under /debug/pprof/ to mux.
func Register(mux *http.ServeMux) {
	mux.HandleFunc("GET /debug/pprof/", pprof.Index)
	mux.HandleFunc("GET /debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("GET /debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("GET /debug/pprof/trace", pprof.Trace)
}
