package extender

import (
	"bytes"
	"encoding/json"

	v1 "k8s.io/api/core/v1"
)

// With nodeCacheCapable kube-scheduler sends every candidate node's name:
// 5,000 strings a request at Kubernetes' node limit, which encoding/json
// decodes into 5,000 allocations in a slice grown as it goes (a third of
// a request's garbage). nameList decodes them into one string, each name
// a slice of it, when every name is plain ASCII without escapes (node
// names are DNS subdomains); anything else is left to encoding/json, so
// the result and the errors are the same.

// wireArgs is extenderv1.ExtenderArgs as it is decoded.
type wireArgs struct {
	Pod       *v1.Pod
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
	// One string for all names; each name is a slice of it.
	s := string(data)
	names = getNames(bytes.Count(data, []byte{','}) + 1)
	i := skipSpace(s, 1)
	if i == len(s)-1 && s[i] == ']' {
		return names, true
	}
	for i < len(s) {
		if s[i] != '"' {
			return nil, false
		}
		j := i + 1
		for j < len(s) && s[j] != '"' {
			if c := s[j]; c == '\\' || c < 0x20 || c >= 0x80 {
				return nil, false
			}
			j++
		}
		if j == len(s) {
			return nil, false
		}
		names = append(names, s[i+1:j])
		i = skipSpace(s, j+1)
		switch {
		case i < len(s) && s[i] == ',':
			i = skipSpace(s, i+1)
		case i == len(s)-1 && s[i] == ']':
			return names, true
		default:
			return nil, false
		}
	}
	return nil, false
}

func skipSpace(s string, i int) int {
	for i < len(s) && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r') {
		i++
	}
	return i
}
