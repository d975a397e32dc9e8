package extender

import (
	"encoding/json"
	"fmt"
	"slices"
	"testing"
	"unsafe"
)

// nameCases are arrays plainNames decodes itself and ones it leaves to
// encoding/json (escapes, non-ASCII, other types, malformed).
var nameCases = []string{
	`[]`, ` [ ] `, `["a"]`, `["node-0001","node-0002"]`, "[ \"a\" ,\n\t\"b\" ]", `[""]`,
	`["a\"b"]`, `["caf\u00e9"]`, `["café"]`, `["a",1]`, `[null]`, `null`, `["a",]`, `["a"`, `{"a":1}`, `"a"`,
	`["a" "b"]`, `[,"a"]`, "[\"a\x01\"]",
}

// TestNameListAsEncodingJSON: every input decodes as encoding/json decodes
// it into a []string, or fails where it fails.
func TestNameListAsEncodingJSON(t *testing.T) {
	for _, in := range nameCases {
		checkNameList(t, []byte(in))
	}
}

func FuzzNameList(f *testing.F) {
	for _, in := range nameCases {
		f.Add([]byte(in))
	}
	f.Fuzz(checkNameList)
}

func checkNameList(t *testing.T, data []byte) {
	var want []string
	werr := json.Unmarshal(data, &want)
	var got nameList
	gerr := json.Unmarshal(data, &got)
	if (werr == nil) != (gerr == nil) {
		t.Fatalf("%q: encoding/json says %v, nameList %v", data, werr, gerr)
	}
	if werr == nil && (!slices.Equal(want, got) || (want == nil) != (got == nil)) {
		t.Fatalf("%q: encoding/json decodes %q (nil %v), nameList %q (nil %v)", data, want, want == nil, got, got == nil)
	}
}

// TestPlainNamesTakesPlainArrays: the fast path is taken for plain names
// (else the test above would pass with encoding/json alone).
func TestPlainNamesTakesPlainArrays(t *testing.T) {
	for _, in := range []string{`[]`, `["node-0001", "node-0002"]`} {
		if _, ok := plainNames([]byte(in)); !ok {
			t.Errorf("%s: not decoded by plainNames", in)
		}
	}
	for _, in := range []string{`["a\"b"]`, `["café"]`, `[1]`} {
		if _, ok := plainNames([]byte(in)); ok {
			t.Errorf("%s: decoded by plainNames; it is encoding/json's to decode", in)
		}
	}
}

// TestPlainNamesKeepNoCopy: decoding the same names again gives the same
// strings, not copies (a request's names cost no memory once their nodes
// were named), and they decode as before.
func TestPlainNamesKeepNoCopy(t *testing.T) {
	var want []string
	for i := range 2000 {
		want = append(want, fmt.Sprintf("node-%04d", i))
	}
	data, _ := json.Marshal(want)
	decode := func() []string {
		got, ok := plainNames(data)
		if !ok || !slices.Equal(got, want) {
			t.Fatalf("plainNames: %v, %d names", ok, len(got))
		}
		return slices.Clone(got)
	}
	first, again := decode(), decode()
	for i := range first {
		if unsafe.StringData(first[i]) != unsafe.StringData(again[i]) {
			t.Fatalf("name %d, %s, decoded into a new string the second time", i, again[i])
		}
	}
}

// TestInternedIsBounded: names made up by a client do not pile up.
func TestInternedIsBounded(t *testing.T) {
	for i := range 3 * maxInterned {
		plainNames([]byte(fmt.Sprintf(`["made-up-%d"]`, i)))
		if n := len(interned.m); n > maxInterned {
			t.Fatalf("%d names interned, more than %d", n, maxInterned)
		}
	}
}
