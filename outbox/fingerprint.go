package outbox

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
)

// decodeJSON parses a JSON document into maps, slices, strings, bools, nil and
// json.Numbers, refusing anything but whitespace after the first value.
func decodeJSON(raw []byte) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, err
	}
	if len(bytes.Trim(raw[dec.InputOffset():], " \t\r\n")) > 0 { // JSON whitespace only
		return nil, errTrailingData
	}
	return v, nil
}

// canonicalJSON re-encodes a decoded JSON value so that documents that mean the same
// have the same bytes: object keys sorted, no insignificant whitespace, strings escaped
// one way, and numbers in one spelling (1, 1.0 and 1e0 are all "1").
func canonicalJSON(v any) []byte {
	return appendCanonical(make([]byte, 0, 512), v)
}

func appendCanonical(b []byte, v any) []byte {
	switch v := v.(type) {
	case map[string]any:
		keys := make([]string, 0, len(v))
		for k := range v {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		b = append(b, '{')
		for i, k := range keys {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendString(b, k)
			b = append(b, ':')
			b = appendCanonical(b, v[k])
		}
		return append(b, '}')
	case []any:
		b = append(b, '[')
		for i, e := range v {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendCanonical(b, e)
		}
		return append(b, ']')
	case string:
		return appendString(b, v)
	case json.Number:
		return append(b, canonicalNumber(string(v))...)
	case bool:
		return strconv.AppendBool(b, v)
	case nil:
		return append(b, "null"...)
	}
	// Unreachable: the value came from the JSON decoder and holds only JSON types.
	panic(fmt.Sprintf("outbox: unexpected %T in decoded JSON", v))
}

// appendString writes s as a JSON string, escaping only what JSON requires: the quote,
// the backslash and control characters. The decoder has already replaced invalid UTF-8.
func appendString(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 0x20 && c != '"' && c != '\\' {
			continue
		}
		b = append(b, s[start:i]...)
		switch c {
		case '"', '\\':
			b = append(b, '\\', c)
		case '\n':
			b = append(b, '\\', 'n')
		case '\t':
			b = append(b, '\\', 't')
		case '\r':
			b = append(b, '\\', 'r')
		default:
			b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
		}
		start = i + 1
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}

// canonicalNumber spells a JSON number one way. Integer literals are kept as written (so
// large ids keep every digit); other numbers are parsed as float64 and printed in the
// shortest form that round-trips, as an integer when they are one.
func canonicalNumber(s string) string {
	if !strings.ContainsAny(s, ".eE") {
		if s == "-0" {
			return "0"
		}
		return s
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || math.IsInf(f, 0) {
		return s
	}
	if f == 0 {
		return "0"
	}
	if f == math.Trunc(f) && math.Abs(f) < 1<<53 {
		return strconv.FormatFloat(f, 'f', 0, 64)
	}
	return strconv.FormatFloat(f, 'g', -1, 64)
}

// fingerprint identifies a request for comparison: the same connector, ordering key and
// payload (in canonical form) give the same 32 bytes.
func fingerprint(connector, orderingKey string, canonicalPayload []byte) []byte {
	h := sha256.New()
	h.Write([]byte("outboxd-request-v1\x00"))
	h.Write([]byte(connector))
	h.Write([]byte{0})
	h.Write([]byte(orderingKey))
	h.Write([]byte{0})
	h.Write(canonicalPayload)
	return h.Sum(nil)
}
