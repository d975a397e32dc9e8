package extender

import (
	"bytes"
	"encoding/json"
	"sync"

	v1 "k8s.io/api/core/v1"
)

// With nodeCacheCapable kube-scheduler sends every candidate node's name:
// 5,000 strings a request at Kubernetes' node limit, which encoding/json
// decodes into 5,000 allocations in a slice grown as it goes (a third of
// a request's garbage). nameList decodes them itself when every name is
// plain ASCII without escapes (node names are DNS subdomains); anything
// else is left to encoding/json, so the result and the errors are the
// same.
//
// It does not copy them either: kube-scheduler sends the same few
// thousand names in every request, so each is made into a string once and
// kept (interned); a request's names are the kept strings, looked up by
// their bytes, which allocates nothing. Copying the names into one fresh
// string per request, as before, was 100 KB of a filter and prioritize's
// 195 KB of garbage at 5,000 nodes, and so about half of what makes the
// collector run (and mark the cache's 50,000 pods) in the middle of
// requests.

// wireArgs is extenderv1.ExtenderArgs as it is decoded.
type wireArgs struct {
	Pod       *wirePod
	Nodes     *v1.NodeList
	NodeNames *nameList
}

// nameList is a []string that decodes plain names without one allocation
// each.
type nameList []string

// UnmarshalJSON implements json.Unmarshaler. encoding/json calls it with
// one whole, valid JSON value.
func (l *nameList) UnmarshalJSON(data []byte) error {
	if names, ok := plainNames(data); ok {
		*l = names
		return nil
	}
	return json.Unmarshal(data, (*[]string)(l))
}

// plainNames decodes a JSON array of strings that need no unescaping; ok
// is false for anything else.
func plainNames(data []byte) (names []string, ok bool) {
	data = bytes.TrimSpace(data)
	if len(data) < 2 || data[0] != '[' {
		return nil, false
	}
	names = getNames(bytes.Count(data, []byte{','}) + 1)
	interned.Lock()
	defer interned.Unlock()
	i := skipSpace(data, 1)
	if i == len(data)-1 && data[i] == ']' {
		return names, true
	}
	for i < len(data) {
		if data[i] != '"' {
			return nil, false
		}
		j := i + 1
		for j < len(data) && data[j] != '"' {
			if c := data[j]; c == '\\' || c < 0x20 || c >= 0x80 {
				return nil, false
			}
			j++
		}
		if j == len(data) {
			return nil, false
		}
		names = append(names, intern(data[i+1:j]))
		i = skipSpace(data, j+1)
		switch {
		case i < len(data) && data[i] == ',':
			i = skipSpace(data, i+1)
		case i == len(data)-1 && data[i] == ']':
			return names, true
		default:
			return nil, false
		}
	}
	return nil, false
}

// interned is the node names requests have named, each kept as the one
// string requests use. It holds at most maxInterned names; when full it is
// emptied, so names of nodes long gone (or made up by a client) do not
// stay, and requests go on making their names anew until it fills again.
var interned struct {
	sync.Mutex
	m map[string]string
}

// maxInterned is the most names interned: three times Kubernetes' limit
// of 5,000 nodes, room for every node and some churn of names.
const maxInterned = 15000

// intern is name as a string kept in interned (whose lock is held).
func intern(name []byte) string {
	if s, ok := interned.m[string(name)]; ok { // no allocation: a lookup by bytes
		return s
	}
	if interned.m == nil || len(interned.m) >= maxInterned {
		interned.m = make(map[string]string, 1024)
	}
	s := string(name)
	interned.m[s] = s
	return s
}

func skipSpace(s []byte, i int) int {
	for i < len(s) && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r') {
		i++
	}
	return i
}

// encoding/json reads a request three times over: checkValid scans the
// whole body before decoding, the decoder scans the node names again to
// find their end, and nameList parses them. At 500 nodes the two scans
// were most of decoding a request's names. A nodeCacheCapable request
// from kube-scheduler has one shape, encoding/json's of ExtenderArgs:
//
//	{"Pod":{...},"Nodes":null,"NodeNames":[...]}
//
// decodeNamesArgs takes that shape apart itself: the pod's object by
// matching braces (outside strings), then the literal keys, then the names
// with plainNames. The pod is decoded by wirePod, which validates it; the
// names by plainNames, which accepts only valid plain names; the rest is
// literal. So the body is valid JSON and decodes to what encoding/json
// makes of it whenever ok is true; anything else (another shape, spaces,
// escapes, a pod that does not decode) is left to encoding/json, with its
// result and its errors.
func decodeNamesArgs(data []byte) (w wireArgs, ok bool) {
	const head, middle = `{"Pod":`, `,"Nodes":null,"NodeNames":`
	rest, ok := bytes.CutPrefix(data, []byte(head))
	if !ok {
		return w, false
	}
	end := objectEnd(rest)
	if end < 0 {
		return w, false
	}
	pod := rest[:end]
	if rest, ok = bytes.CutPrefix(rest[end:], []byte(middle)); !ok {
		return w, false
	}
	rest = bytes.TrimRight(rest, " \t\r\n")
	if len(rest) == 0 || rest[len(rest)-1] != '}' {
		return w, false
	}
	names, ok := plainNames(rest[:len(rest)-1])
	if !ok {
		return w, false
	}
	p := &wirePod{}
	if err := p.UnmarshalJSON(pod); err != nil {
		putNames(names)
		return w, false
	}
	w.Pod = p
	l := nameList(names)
	w.NodeNames = &l
	return w, true
}

// objectEnd is the length of the JSON object data starts with, found by
// matching braces and brackets outside strings; -1 when data does not start
// with '{' or the object does not end. It does not validate: a caller
// decodes what it delimits.
func objectEnd(data []byte) int {
	if len(data) == 0 || data[0] != '{' {
		return -1
	}
	depth := 0
	for i := 0; i < len(data); i++ {
		switch data[i] {
		case '"':
			for i++; i < len(data) && data[i] != '"'; i++ {
				if data[i] == '\\' {
					i++
				}
			}
		case '{', '[':
			depth++
		case '}', ']':
			depth--
			if depth == 0 {
				return i + 1
			}
		}
	}
	return -1
}
