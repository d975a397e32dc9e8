package policy

import (
	"crypto/sha256"
	"encoding/base32"
	"strings"
)

// hashLen is how many base32 characters of a SHA-256 name a set or chain:
// 70 bits, so collisions among a cluster's few thousand names are not a
// concern, and the names stay well inside the kernel's limits.
const hashLen = 14

func hash(parts ...string) string {
	h := sha256.New()
	for _, p := range parts {
		h.Write([]byte(p))
		h.Write([]byte{0})
	}
	return base32.StdEncoding.EncodeToString(h.Sum(nil))[:hashLen]
}

// Hashed chain kinds.
const (
	kindPodEgress     = "E-"
	kindPodIngress    = "I-"
	kindPolicyEgress  = "PE-"
	kindPolicyIngress = "PI-"
	kindCNPEgress     = "CE-"
	kindCNPIngress    = "CI-"
)

// chainName is PolicyChainPrefix + kind + hash: at most 26 bytes.
func chainName(kind string, parts ...string) string {
	return PolicyChainPrefix + kind + hash(parts...)
}

// Set kinds: the letter after SetPrefix.
const (
	setKindPods    = 'p' // hash:ip, pod IPs of a rule's selector peers
	setKindNets    = 'n' // hash:net, a rule's ipBlocks
	setKindNamed   = 'q' // hash:ip,port, every pod's ports of one name (egress)
	setKindLocal   = 'l' // hash:ip,port, the local pods' ports of one name (ingress)
	setKindEgress  = 'e' // hash:net,iface, the local pods of one TABBY-NP-E- chain
	setKindIngress = 'i' // hash:net,iface, the local pods of one TABBY-NP-I- chain
	// hash:net,iface, the local pods of the signatures of one dispatch
	// bucket (DispatchBuckets); after 'e' and 'i' in name order.
	setKindFromBucket = 'f'
	setKindToBucket   = 't'
	// 'u' is UnselectedSetName's: the local pods no policy selects.
)

// setName is SetPrefix + kind + family digit + "-" + hash: 26 bytes.
func setName(kind byte, fam int, parts ...string) string {
	return hashedSetName(kind, fam, hash(parts...))
}

// hashedSetName is SetPrefix + kind + family digit + "-" + h in lower case.
func hashedSetName(kind byte, fam int, h string) string {
	return SetPrefix + string(kind) + famDigit[fam] + "-" + strings.ToLower(h)
}

// comment makes a name safe as one iptables argument: [A-Za-z0-9._/:-],
// at most 200 bytes.
func comment(s string) string {
	b := []byte(s)
	if len(b) > 200 {
		b = b[:200]
	}
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '/' || c == ':' || c == '-') {
			b[i] = '_'
		}
	}
	if len(b) == 0 {
		return "_"
	}
	return string(b)
}

// validIfaceChars reports whether s is 1..max of [A-Za-z0-9_.-].
func validIfaceChars(s string, max int) bool {
	if len(s) == 0 || len(s) > max {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}
