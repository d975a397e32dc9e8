// Package buildinfo carries the version stamped into tabby's binaries.
package buildinfo

// Version is set at build time with -ldflags "-X github.com/tabbynet/tabby/internal/buildinfo.Version=...".
var Version = "dev"
