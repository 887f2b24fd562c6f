package payment

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"reflect"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/outboxd/outboxd/connectors"
)

// Stripe's limits on metadata (https://docs.stripe.com/api/metadata).
const (
	maxMetadataKeys     = 50
	maxMetadataKeyLen   = 40
	maxMetadataValueLen = 500
)

// decodeParams decodes a row's params, a JSON object named the way the Stripe API names
// them ("payment_method_types", "metadata"), into dst, a pointer to a stripe-go params
// struct.
//
// stripe-go's v1 params structs carry only form tags (form:"payment_method_types"), so
// plain json.Unmarshal would match "amount" but silently drop "payment_method_types".
// decodeParams renames each key to its Go field by the form tag, following dst's type
// down through nested structs, slices and maps, and then decodes strictly: a parameter
// stripe-go does not know, or a value of the wrong JSON type, is an error. The embedded
// stripe.Params (idempotency key, headers, connected account) cannot be set from a row.
func decodeParams(raw json.RawMessage, dst any) error {
	renamed, err := rename(raw, reflect.TypeOf(dst), "params")
	if err != nil {
		return &badParamsError{err: err}
	}
	b, err := json.Marshal(renamed)
	if err != nil {
		return &badParamsError{err: fmt.Errorf("params: %w", err)}
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(dst); err != nil {
		return &badParamsError{err: fmt.Errorf("params: %w", goNamesToStripe(err))}
	}
	return nil
}

// rename returns raw with object keys renamed from form-tag names to Go field names, as
// far as t describes them; values t says nothing about are kept verbatim.
func rename(raw json.RawMessage, t reflect.Type, path string) (any, error) {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	trimmed := bytes.TrimSpace(raw)
	if bytes.Equal(trimmed, []byte("null")) {
		return raw, nil
	}
	switch t.Kind() {
	case reflect.Struct:
		var obj map[string]json.RawMessage
		if err := json.Unmarshal(raw, &obj); err != nil {
			return nil, fmt.Errorf("%s: must be a JSON object", path)
		}
		fields := formFields(t)
		out := make(map[string]any, len(obj))
		for name, v := range obj {
			f, ok := fields[name]
			if !ok {
				return nil, fmt.Errorf("%s: unknown parameter %q", path, name)
			}
			rv, err := rename(v, f.Type, path+"."+name)
			if err != nil {
				return nil, err
			}
			out[f.Name] = rv
		}
		return out, nil
	case reflect.Slice:
		var arr []json.RawMessage
		if err := json.Unmarshal(raw, &arr); err != nil {
			return nil, fmt.Errorf("%s: must be a JSON array", path)
		}
		out := make([]any, len(arr))
		for i, v := range arr {
			// A null element has no form encoding: stripe-go would drop it silently.
			if bytes.Equal(bytes.TrimSpace(v), []byte("null")) {
				return nil, fmt.Errorf("%s[%d]: null is not a value Stripe accepts in a list; leave it out", path, i)
			}
			rv, err := rename(v, t.Elem(), fmt.Sprintf("%s[%d]", path, i))
			if err != nil {
				return nil, err
			}
			out[i] = rv
		}
		return out, nil
	case reflect.Map:
		var obj map[string]json.RawMessage
		if err := json.Unmarshal(raw, &obj); err != nil {
			return nil, fmt.Errorf("%s: must be a JSON object", path)
		}
		// Every map in the operations' params is metadata, which Stripe limits to 50
		// keys of up to 40 characters with values of up to 500, and refuses more on
		// every attempt. Characters are counted as code points, so that nothing Stripe
		// takes is refused here.
		if len(obj) > maxMetadataKeys {
			return nil, fmt.Errorf("%s: %d keys; Stripe takes at most %d", path, len(obj), maxMetadataKeys)
		}
		out := make(map[string]any, len(obj))
		for k, v := range obj {
			if n := utf8.RuneCountInString(k); n > maxMetadataKeyLen {
				return nil, fmt.Errorf("%s: the key %q is %d characters; Stripe takes at most %d", path, connectors.Excerpt(k, 60), n, maxMetadataKeyLen)
			}
			var s string
			if json.Unmarshal(v, &s) == nil {
				if n := utf8.RuneCountInString(s); n > maxMetadataValueLen {
					return nil, fmt.Errorf("%s.%s: the value is %d characters; Stripe takes at most %d", path, k, n, maxMetadataValueLen)
				}
			}
			// A key is one bracketed part of the form key (metadata[k]), and stripe-go keeps
			// its brackets: "a][b" would go out as metadata[a][b], "" as metadata[]. Stripe
			// takes no brackets in metadata keys.
			if k == "" || strings.ContainsAny(k, "[]") {
				return nil, fmt.Errorf("%s: the key %q is empty or has square brackets, which Stripe does not take", path, k)
			}
			// A null value would go out as an empty string, which Stripe reads as "unset
			// this key" in metadata.
			if bytes.Equal(bytes.TrimSpace(v), []byte("null")) {
				return nil, fmt.Errorf("%s.%s: null is not a value; give a string, or leave the key out", path, k)
			}
			rv, err := rename(v, t.Elem(), path+"."+k)
			if err != nil {
				return nil, err
			}
			out[k] = rv
		}
		return out, nil
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		// A JSON number is a value, however it is spelt: 2000.0 and 2e3 are 2000 (the
		// relay compares payloads by value, and jsonb keeps 2000.0 as written). A value
		// that is not a whole number is left for the decoder to refuse.
		if n, ok := integralNumber(trimmed); ok {
			return n, nil
		}
		return raw, nil
	default:
		return raw, nil
	}
}

// integralNumber returns the JSON number s as an integer literal when its value is a
// whole number that fits an int64. Exponents are bounded so a hostile 1e999999999
// costs nothing.
func integralNumber(s []byte) (json.RawMessage, bool) {
	if len(s) == 0 || len(s) > 100 || (s[0] != '-' && (s[0] < '0' || s[0] > '9')) {
		return nil, false
	}
	if i := bytes.IndexAny(s, "eE"); i >= 0 {
		e, err := strconv.Atoi(strings.TrimPrefix(string(s[i+1:]), "+"))
		if err != nil || e > 100 || e < -100 {
			return nil, false
		}
	}
	r, ok := new(big.Rat).SetString(string(s))
	if !ok || !r.IsInt() || !r.Num().IsInt64() {
		return nil, false
	}
	return json.RawMessage(r.Num().String()), true
}

// formFields maps the form-tag names of t's fields to the fields. Embedded structs
// tagged form:"*" (stripe.Params) and fields tagged form:"-" (path parameters) are left
// out, so a row cannot reach them.
func formFields(t reflect.Type) map[string]reflect.StructField {
	fields := make(map[string]reflect.StructField, t.NumField())
	for i := range t.NumField() {
		f := t.Field(i)
		if !f.IsExported() || f.Anonymous {
			continue
		}
		name, _, _ := strings.Cut(f.Tag.Get("form"), ",")
		if name == "" || name == "-" || name == "*" {
			continue
		}
		fields[name] = f
	}
	return fields
}

// goNamesToStripe keeps Go's type names out of a decoding error where it can; the
// message still says which value was wrong.
func goNamesToStripe(err error) error {
	if te, ok := errors.AsType[*json.UnmarshalTypeError](err); ok {
		return fmt.Errorf("a JSON %s cannot go in %s", te.Value, te.Field)
	}
	return err
}
