// Package logging builds the one slog logger of a tabby program from its
// --log-level and --log-format flags (or the CNI config's logLevel and
// logFormat), and routes client-go's klog into it, so that a JSON log is
// JSON on every line, whoever wrote the line.
package logging

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"

	"github.com/go-logr/logr"
	"github.com/spf13/pflag"
	"k8s.io/klog/v2"
)

// The log formats: text is slog's key=value lines (the default, as
// kubectl's and calico-node's), json is one JSON object a line for log
// shippers (Fluent Bit, Vector, Loki's promtail).
const (
	FormatText = "text"
	FormatJSON = "json"
)

// Formats lists the formats in the order help texts name them.
var Formats = []string{FormatText, FormatJSON}

// ParseLevel reads debug, info, warn (or warning) or error, in any case.
func ParseLevel(s string) (slog.Level, error) {
	switch strings.ToLower(s) {
	case "debug":
		return slog.LevelDebug, nil
	case "info":
		return slog.LevelInfo, nil
	case "warn", "warning":
		return slog.LevelWarn, nil
	case "error":
		return slog.LevelError, nil
	}
	return 0, fmt.Errorf("log level %q is not known: use debug, info, warn or error", s)
}

// CheckFormat says whether s is a log format ("" is not).
func CheckFormat(s string) error {
	for _, f := range Formats {
		if s == f {
			return nil
		}
	}
	return fmt.Errorf("log format %q is not known: use %s", s, strings.Join(Formats, " or "))
}

// Handler is the slog handler of a format at a level, writing to w.
func Handler(w io.Writer, level slog.Leveler, format string) (slog.Handler, error) {
	if err := CheckFormat(format); err != nil {
		return nil, err
	}
	opts := &slog.HandlerOptions{Level: level}
	if format == FormatJSON {
		return slog.NewJSONHandler(w, opts), nil
	}
	return slog.NewTextHandler(w, opts), nil
}

// Flags are a program's --log-level and --log-format.
type Flags struct {
	Level, Format string
}

// AddFlags adds --log-level and --log-format (defaults info and text) to fs.
func AddFlags(fs *pflag.FlagSet) *Flags {
	f := &Flags{}
	fs.StringVar(&f.Level, "log-level", "info", "debug, info, warn or error")
	fs.StringVar(&f.Format, "log-format", FormatText, "log format: text (key=value lines) or json (one JSON object a line, for log shippers); client-go's own messages come out the same way")
	return f
}

// Logger builds the logger the flags ask for, writing to w, and makes it
// klog's too: client-go logs through klog (reflector errors, retries,
// throttling), and without this its lines would be klog's own text in the
// middle of a JSON log. Errors name the flag to fix.
func (f *Flags) Logger(w io.Writer) (*slog.Logger, error) {
	lvl, err := ParseLevel(f.Level)
	if err != nil {
		return nil, fmt.Errorf("--log-level: %w", err)
	}
	h, err := Handler(w, lvl, f.Format)
	if err != nil {
		return nil, fmt.Errorf("--log-format: %w", err)
	}
	log := slog.New(h)
	klog.SetSlogLogger(log)
	return log, nil
}

// ClientContext returns ctx carrying log as the logger client-go's calls
// made with it use (klog.FromContext), so their lines land in log rather
// than klog's global logger. A call cut short because ctx (or a deadline
// under it) ended logs its "error" at debug level: the caller stopped it
// on purpose, and client-go's error line on reading the response body
// would otherwise say ERROR on every clean shutdown.
func ClientContext(ctx context.Context, log *slog.Logger) context.Context {
	return klog.NewContext(ctx, logr.FromSlogHandler(endedQuiet{log.Handler()}))
}

// endedQuiet lowers error records whose error is a context's end to debug.
type endedQuiet struct{ slog.Handler }

func (h endedQuiet) Handle(ctx context.Context, r slog.Record) error {
	if r.Level >= slog.LevelError && contextEnded(r) {
		if !h.Handler.Enabled(ctx, slog.LevelDebug) {
			return nil
		}
		r.Level = slog.LevelDebug
	}
	return h.Handler.Handle(ctx, r)
}

func (h endedQuiet) WithAttrs(as []slog.Attr) slog.Handler {
	return endedQuiet{h.Handler.WithAttrs(as)}
}

func (h endedQuiet) WithGroup(name string) slog.Handler {
	return endedQuiet{h.Handler.WithGroup(name)}
}

func contextEnded(r slog.Record) bool {
	ended := false
	r.Attrs(func(a slog.Attr) bool {
		if err, ok := a.Value.Any().(error); ok &&
			(errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)) {
			ended = true
			return false
		}
		return true
	})
	return ended
}
