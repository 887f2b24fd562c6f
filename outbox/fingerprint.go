package outbox

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"math"
	"strconv"
	"strings"
)

// decodeJSON parses a JSON document into maps, slices and json.Numbers, rejecting
// trailing data after the first value.
func decodeJSON(raw []byte) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, err
	}
	if _, err := dec.Token(); err == nil {
		return nil, errTrailingData
	}
	return v, nil
}

// canonicalJSON re-encodes a decoded JSON value so that documents that mean the same
// have the same bytes: object keys sorted, no insignificant whitespace, and numbers in
// one spelling (1, 1.0 and 1e0 are all "1").
func canonicalJSON(v any) []byte {
	b, err := json.Marshal(normalizeNumbers(v))
	if err != nil {
		// Unreachable: the value came from the JSON decoder and holds only JSON types.
		panic("outbox: re-encode decoded JSON: " + err.Error())
	}
	return b
}

func normalizeNumbers(v any) any {
	switch v := v.(type) {
	case map[string]any:
		for k, e := range v {
			v[k] = normalizeNumbers(e)
		}
		return v
	case []any:
		for i, e := range v {
			v[i] = normalizeNumbers(e)
		}
		return v
	case json.Number:
		return json.Number(canonicalNumber(string(v)))
	default:
		return v
	}
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
