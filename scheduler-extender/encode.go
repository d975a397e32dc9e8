package extender

import (
	"bytes"
	"encoding/json"
	"strconv"

	extenderv1 "k8s.io/kube-scheduler/extender/v1"
)

// At 5,000 nodes an answer is thousands of names, reasons and scores:
// encoding/json reflects on each and sorts the failed nodes' map by name
// (a tenth of a request's CPU). The answers kube-scheduler gets most,
// filter with node names and prioritize, are written here directly, as
// the same JSON that encoding/json writes for them, but unsorted (a JSON
// object's order means nothing; kube-scheduler decodes into a map).
// TestEncodeAsEncodingJSON compares the two.

// appendAnswer writes v to buf when it is an answer written here; false
// leaves buf as it was.
func appendAnswer(buf *bytes.Buffer, v any) bool {
	b := buf.AvailableBuffer()
	switch a := v.(type) {
	case *extenderv1.ExtenderFilterResult:
		var ok bool
		if b, ok = appendFilterResult(b, a); !ok {
			return false
		}
	case extenderv1.HostPriorityList:
		b = appendPriorities(b, a)
	default:
		return false
	}
	buf.Write(b)
	return true
}

// appendFilterResult appends r as JSON; ok is false when r carries Nodes
// (full Node objects: encoding/json's to write).
func appendFilterResult(b []byte, r *extenderv1.ExtenderFilterResult) ([]byte, bool) {
	if r.Nodes != nil {
		return b, false
	}
	b = append(b, `{"Nodes":null,"NodeNames":`...)
	if r.NodeNames == nil {
		b = append(b, "null"...)
	} else {
		b = appendStrings(b, *r.NodeNames)
	}
	b = append(b, `,"FailedNodes":`...)
	b = appendStringMap(b, r.FailedNodes)
	b = append(b, `,"FailedAndUnresolvableNodes":`...)
	b = appendStringMap(b, r.FailedAndUnresolvableNodes)
	b = append(b, `,"Error":`...)
	b = appendString(b, r.Error)
	return append(b, '}'), true
}

// appendPriorities appends l as JSON.
func appendPriorities(b []byte, l extenderv1.HostPriorityList) []byte {
	if l == nil {
		return append(b, "null"...)
	}
	b = append(b, '[')
	for i := range l {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"Host":`...)
		b = appendString(b, l[i].Host)
		b = append(b, `,"Score":`...)
		b = strconv.AppendInt(b, l[i].Score, 10)
		b = append(b, '}')
	}
	return append(b, ']')
}

func appendStrings(b []byte, l []string) []byte {
	b = append(b, '[')
	for i, s := range l {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendString(b, s)
	}
	return append(b, ']')
}

func appendStringMap(b []byte, m map[string]string) []byte {
	if m == nil {
		return append(b, "null"...)
	}
	b = append(b, '{')
	first := true
	for k, v := range m {
		if !first {
			b = append(b, ',')
		}
		first = false
		b = appendString(b, k)
		b = append(b, ':')
		b = appendString(b, v)
	}
	return append(b, '}')
}

// appendString appends s as a JSON string: as it is when it is printable
// ASCII that encoding/json writes unescaped, else as encoding/json writes
// it.
func appendString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c >= 0x80 || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			q, _ := json.Marshal(s) // a string always encodes
			return append(b, q...)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}
