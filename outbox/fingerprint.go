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

// canonicalNumber spells a JSON number one way, exactly: numbers that are equal have the
// same spelling (1, 1.0, 1e0 and 10e-1 are all "1"; 1e20 and 100000000000000000000 are
// both "100000000000000000000"), and numbers that differ never share one, however many
// digits they have (no rounding through float64, which would make 0.1 and
// 0.1000000000000000000001, or two 20-digit amounts, the same request). This is also how
// PostgreSQL's jsonb compares numbers.
func canonicalNumber(s string) string {
	d, ok := parseNumber(s)
	if !ok {
		return s // refused by prepare before it is written
	}
	return d.canonical()
}

// decimal is a JSON number's exact value: digits (no leading or trailing zeros; empty
// for zero) times ten to the power exp. scale is the count of digits after the decimal
// point as written, PostgreSQL numeric's display scale.
type decimal struct {
	neg    bool
	digits string
	exp    int
	scale  int
}

// maxExponent bounds a JSON number's written exponent: PostgreSQL refuses one of
// INT_MAX/2 or more, whatever the number (even 0e1073741823), and a non-zero number far
// sooner.
const maxExponent = math.MaxInt32/2 - 1

// parseNumber reads a number in JSON's grammar (as the decoder checked it). It returns
// false for an exponent beyond ±maxExponent.
func parseNumber(s string) (decimal, bool) {
	var d decimal
	if strings.HasPrefix(s, "-") {
		d.neg, s = true, s[1:]
	}
	e := 0
	if i := strings.IndexAny(s, "eE"); i >= 0 {
		n, err := strconv.ParseInt(s[i+1:], 10, 64)
		if err != nil || n > maxExponent || n < -maxExponent {
			return decimal{}, false
		}
		e, s = int(n), s[:i]
	}
	intPart, frac, _ := strings.Cut(s, ".")
	d.scale = max(0, len(frac)-e)
	digits := strings.TrimLeft(intPart+frac, "0")
	trimmed := strings.TrimRight(digits, "0")
	d.digits, d.exp = trimmed, e-len(frac)+len(digits)-len(trimmed)
	if d.digits == "" {
		d.neg, d.exp = false, 0
	}
	return d, true
}

// canonical spells d one way: an integer with up to 20 trailing zeros as one, a fraction
// with up to 6 zeros after the point as one, anything else as d.ddde±N.
func (d decimal) canonical() string {
	if d.digits == "" {
		return "0"
	}
	var b strings.Builder
	if d.neg {
		b.WriteByte('-')
	}
	n := len(d.digits)
	pos := n + d.exp // digits before the decimal point
	switch {
	case d.exp >= 0 && d.exp <= 20:
		b.WriteString(d.digits)
		b.WriteString(strings.Repeat("0", d.exp))
	case d.exp < 0 && pos > 0:
		b.WriteString(d.digits[:pos])
		b.WriteByte('.')
		b.WriteString(d.digits[pos:])
	case d.exp < 0 && pos > -6:
		b.WriteString("0.")
		b.WriteString(strings.Repeat("0", -pos))
		b.WriteString(d.digits)
	default:
		b.WriteByte(d.digits[0])
		if n > 1 {
			b.WriteByte('.')
			b.WriteString(d.digits[1:])
		}
		b.WriteByte('e')
		if pos-1 >= 0 {
			b.WriteByte('+')
		}
		b.WriteString(strconv.Itoa(pos - 1))
	}
	return b.String()
}

// maxWrittenOut bounds how many bytes more than written a payload's numbers take in the
// text PostgreSQL writes out for it. jsonb keeps a number's value and its scale as
// written and writes it without an exponent: 0e-16383 (8 bytes) as "0." and 16,383
// zeros, 1e131071 as a 1 and 131,071 zeros. Every claim of a row has PostgreSQL write its
// payload out, and past 1 GiB it cannot: the claim fails, and with it every round of
// every relay on the database (all connector instances' claims and outcomes together).
// A few kilobytes of such numbers are enough, within the intent API's 1 MiB body. 16 MiB
// is far more than numbers as applications write them add (a float64 near 1e-300, the
// extreme, adds about 300 bytes), and keeps what a small request can make a relay hold
// small.
const maxWrittenOut = 16 << 20

// jsonb's size limits (PostgreSQL's jsonb.h and jsonb_util.c). A string, and a
// container's binary form (a 4-byte header, a 4-byte entry per element or two per
// member, and the elements' data), must stay under 2^28 bytes (JENTRY_OFFLENMASK). And
// jsonb_in gathers an array's elements in an array of 32-byte JsonbValues, and an
// object's members in one of 72-byte JsonbPairs, doubled as they grow, which cannot
// reach 1 GiB (MaxAllocSize). Past them the INSERT fails and aborts the caller's
// transaction: an array of 2^24+1 zeros, 32 MiB of JSON text, is enough.
const (
	jsonbMaxLen     = 1<<28 - 1
	jsonbMaxElems   = 1 << 24
	jsonbMaxMembers = 1 << 23
)

// storable is what checkStorable finds of a decoded JSON value.
type storable struct {
	// refused is the first number that PostgreSQL's numeric (and so jsonb) refuses, or
	// "": more than 131072 digits before the decimal point, or more than 16383 after it
	// as written.
	refused string
	// writtenOut is how many bytes more than written the numbers take in PostgreSQL's
	// text of the value (numbers that take fewer count as none; see maxWrittenOut).
	writtenOut int64
	// size bounds the value's jsonb from above: every number counts with numeric's long
	// header and 3 bytes of alignment before it, as every container does, so a value
	// within a few bytes a number of the limit may be refused although jsonb would take
	// it.
	size int64
	// tooLarge names what exceeds jsonb's size limits, or is "". (Its limits on the
	// number of elements and members are counted in the text: see jsonbCounts.)
	tooLarge string
}

// checkStorable walks a decoded JSON value once (see storable).
func checkStorable(v any) storable {
	var refused, tooLarge string
	var writtenOut int64
	// walk returns v's bytes in its container's data, alignment included.
	var walk func(v any) int64
	walk = func(v any) int64 {
		if refused != "" || tooLarge != "" {
			return 0
		}
		switch v := v.(type) {
		case map[string]any:
			var data int64
			for k, e := range v {
				data += int64(len(k)) + walk(e)
			}
			return jsonbContainerSize(2*len(v), data)
		case []any:
			var data int64
			for _, e := range v {
				data += walk(e)
			}
			return jsonbContainerSize(len(v), data)
		case string:
			if len(v) > jsonbMaxLen {
				tooLarge = fmt.Sprintf("a string of %d bytes (at most %d)", len(v), jsonbMaxLen)
			}
			return int64(len(v))
		case json.Number:
			d, ok := parseNumber(string(v))
			if !ok || d.scale > 16383 || (d.digits != "" && d.exp+len(d.digits)-1 > 131071) {
				refused = string(v)
				if len(v) > 40 {
					refused = string(v[:37]) + "..."
				}
				return 0
			}
			writtenOut += max(0, d.textLen()-int64(len(v)))
			return 3 + d.numericSize()
		}
		return 0 // true, false, null: their entry alone
	}
	size := walk(v) + jsonbTopSize
	if refused == "" && tooLarge == "" && size > jsonbMaxLen {
		tooLarge = fmt.Sprintf("about %d bytes in jsonb's binary form (at most %d)", size, jsonbMaxLen)
	}
	return storable{refused: refused, writtenOut: writtenOut, size: size, tooLarge: tooLarge}
}

// jsonbContainerSize bounds from above the size of a jsonb container in its parent's
// data: up to 3 bytes of alignment, its 4-byte header, a 4-byte entry per element (two
// per member: its name's and its value's) and the elements' data.
func jsonbContainerSize(entries int, data int64) int64 { return 3 + 4 + 4*int64(entries) + data }

// jsonbTopSize is what a jsonb value's top adds to it: a scalar there is stored as an
// array of one element (a header and an entry).
const jsonbTopSize = 8

// numericSize is an upper bound of d's size as a PostgreSQL numeric in jsonb: a 4-byte
// length, numeric's long header (4 bytes) and 2 bytes per base-10000 digit.
func (d decimal) numericSize() int64 {
	if d.digits == "" {
		return 8
	}
	group := func(p int) int { // the base-10000 digit holding 10^p
		if p < 0 {
			return -((-p + 3) / 4)
		}
		return p / 4
	}
	lo, hi := d.exp, d.exp+len(d.digits)-1
	return 8 + 2*int64(group(hi)-group(lo)+1)
}

// textLen is the length of PostgreSQL's text of d (numeric_out, which jsonb uses): its
// sign, its integer digits ("0" when it has none) and, with a scale, the point and that
// many digits after it.
func (d decimal) textLen() int64 {
	n := int64(1)
	if whole := int64(len(d.digits)) + int64(d.exp); d.digits != "" && whole > 0 {
		n = whole
	}
	if d.neg {
		n++
	}
	if d.scale > 0 {
		n += 1 + int64(d.scale)
	}
	return n
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
