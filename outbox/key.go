package outbox

import (
	"crypto/sha256"
	"encoding/base32"
	"encoding/binary"
	"strings"
)

// maxReadable bounds the readable prefix of a [Key], so keys stay short.
const maxReadable = 80

// keyEncoding is lowercase base32 without padding: printable, case-stable, no symbols.
var keyEncoding = base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567").WithPadding(base32.NoPadding)

// Key derives an idempotency key from the parts that name a unit of work: a workflow run id,
// the step, the target. The same parts always give the same key, and different part lists
// give different keys (Key("a", "bc") != Key("ab", "c")).
//
// The key has a readable prefix built from the parts (characters outside [A-Za-z0-9._-]
// become '_', and the prefix is cut at 80 characters) followed by '~' and 26 characters of
// a SHA-256 over the length-prefixed parts, so it is at most 107 characters, printable, and
// collision-resistant however long or odd the parts are.
//
// Never pass a timestamp, an attempt number or a random value: see the package
// documentation, "Choosing a key".
func Key(parts ...string) string {
	h := sha256.New()
	var n [binary.MaxVarintLen64]byte
	for _, p := range parts {
		h.Write(n[:binary.PutUvarint(n[:], uint64(len(p)))])
		h.Write([]byte(p))
	}
	sum := h.Sum(nil)

	var b strings.Builder
	for i, p := range parts {
		if i > 0 {
			b.WriteByte('/')
		}
		for _, r := range p {
			if b.Len() >= maxReadable {
				break
			}
			if r < 128 && (r == '.' || r == '_' || r == '-' || ('a' <= r && r <= 'z') || ('A' <= r && r <= 'Z') || ('0' <= r && r <= '9')) {
				b.WriteRune(r)
			} else {
				b.WriteByte('_')
			}
		}
		if b.Len() >= maxReadable {
			break
		}
	}
	readable := b.String()
	if len(readable) > maxReadable {
		readable = readable[:maxReadable]
	}
	return readable + "~" + keyEncoding.EncodeToString(sum)[:26]
}
