package main

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"sigs.k8s.io/yaml"
)

// outputFormat is the value of -o/--output, as kubectl spells it: table
// (the default), wide (table with more columns), json or yaml (the same
// struct, for scripts). It checks the value when the flag is parsed, so a
// bad -o is a usage error before the command talks to anything.
type outputFormat string

// outputFormats are the values -o takes.
var outputFormats = []string{"table", "wide", "json", "yaml"}

func (f *outputFormat) String() string {
	if *f == "" {
		return "table"
	}
	return string(*f)
}

func (f *outputFormat) Set(s string) error {
	for _, v := range outputFormats {
		if s == v {
			*f = outputFormat(s)
			return nil
		}
	}
	return fmt.Errorf("must be one of %s, not %q", strings.Join(outputFormats, ", "), s)
}

func (f *outputFormat) Type() string { return "format" }

// jsonAlias is the deprecated --json of earlier releases: -o json.
type jsonAlias struct{ f *outputFormat }

func (a jsonAlias) String() string   { return "false" }
func (a jsonAlias) Type() string     { return "bool" }
func (a jsonAlias) IsBoolFlag() bool { return true }

func (a jsonAlias) Set(s string) error {
	switch s {
	case "true":
		*a.f = "json"
	case "false":
	default:
		return fmt.Errorf("--json takes no value (use -o json)")
	}
	return nil
}

// addOutputFlag adds -o/--output to cmd (persistent: for its subcommands
// too), with shell completion of its values; jsonAlias adds the hidden,
// deprecated --json that scripts of earlier releases pass.
func addOutputFlag(cmd *cobra.Command, f *outputFormat, persistent, withJSONAlias bool) {
	fs := cmd.Flags()
	if persistent {
		fs = cmd.PersistentFlags()
	}
	fs.VarP(f, "output", "o", "output format: "+strings.Join(outputFormats, ", ")+" (wide: more columns; json and yaml: the whole report, for scripts)")
	_ = cmd.RegisterFlagCompletionFunc("output", cobra.FixedCompletions(outputFormats, cobra.ShellCompDirectiveNoFileComp))
	if withJSONAlias {
		fs.AddFlag(&pflag.Flag{Name: "json", Usage: "same as -o json", Value: jsonAlias{f}, DefValue: "false", NoOptDefVal: "true"})
		_ = fs.MarkDeprecated("json", "use -o json")
	}
}

// printOutput prints v as format asks: json or yaml of v itself (yaml
// through its json tags, as kubectl does), else table (wide or not).
func printOutput(w io.Writer, format outputFormat, v any, table func(w io.Writer, wide bool) error) error {
	switch format {
	case "json":
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(v)
	case "yaml":
		b, err := yaml.Marshal(v)
		if err != nil {
			return err
		}
		_, err = w.Write(b)
		return err
	}
	return table(w, format == "wide")
}
