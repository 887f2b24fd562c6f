package connectors

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"
	"sync"
)

// DecodeObject decodes a row's JSON object payload into the struct v points to, as
// [DecodeExact] does. Its errors are the row's fault.
func DecodeObject(raw []byte, v any) error {
	if err := DecodeExact(raw, v); err != nil {
		return fmt.Errorf("payload: %w", err)
	}
	return nil
}

// DecodeExact decodes the JSON object raw into the struct v points to, refusing a
// field that is not exactly one of v's (by their json tags), anything after the object,
// and a value that is not an object (null would decode as nothing at all).
// encoding/json alone matches names without regard to case, with Unicode folding, and
// lets the last match win: a payload with "params" and "paramſ" (a long s) would have
// the second replace the first, the value that validation checked and an approver saw.
func DecodeExact(raw []byte, v any) error {
	if trimmed := bytes.TrimSpace(raw); len(trimmed) > 0 && trimmed[0] != '{' {
		return errors.New("not a JSON object")
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields() // a misspelt field would otherwise vanish
	if err := dec.Decode(v); err != nil {
		return fieldOf(raw, reflect.TypeOf(v).Elem(), err)
	}
	if dec.More() {
		return errors.New("more than one JSON value")
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(raw, &fields); err != nil {
		return err
	}
	names := jsonNames(reflect.TypeOf(v).Elem())
	for name := range fields {
		if _, ok := names[name]; !ok {
			return fmt.Errorf("field %q is not one of %s (names are matched exactly)", name, strings.Join(slices.Sorted(maps.Keys(names)), ", "))
		}
	}
	return nil
}

// fieldOf names the field of the JSON object raw whose value err, from decoding raw into
// struct type t, is about, when err does not say: a type's own UnmarshalJSON (time.Time's,
// say) answers "parsing time "tomorrow" as ..." with no word of which field it was. Each
// of t's fields present in raw is decoded alone, in t's order, and the first that fails
// names it. Syntax and type errors are returned as they are (they give an offset, or the
// field's path).
func fieldOf(raw []byte, t reflect.Type, err error) error {
	var syntax *json.SyntaxError
	var typ *json.UnmarshalTypeError
	if errors.As(err, &syntax) || errors.As(err, &typ) || t.Kind() != reflect.Struct {
		return err
	}
	var fields map[string]json.RawMessage
	if json.Unmarshal(raw, &fields) != nil {
		return err
	}
	for f := range t.Fields() {
		name, ok := jsonName(f)
		value, present := fields[name]
		if !ok || !present {
			continue
		}
		if ferr := json.Unmarshal(value, reflect.New(f.Type).Interface()); ferr != nil {
			return fmt.Errorf("field %q: %w", name, ferr)
		}
	}
	return err
}

// jsonNames returns the JSON names of struct type t's fields.
func jsonNames(t reflect.Type) map[string]struct{} {
	names := map[string]struct{}{}
	for f := range t.Fields() {
		if name, ok := jsonName(f); ok {
			names[name] = struct{}{}
		}
	}
	return names
}

// jsonName is the JSON name of struct field f, by its json tag; false when encoding/json
// leaves it out.
func jsonName(f reflect.StructField) (string, bool) {
	name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
	switch {
	case name == "-" || !f.IsExported():
		return "", false
	case name == "":
		return f.Name, true
	}
	return name, true
}

// payloadChecks are the checks connector packages register for their kind's payloads.
var (
	payloadChecksMu sync.RWMutex
	payloadChecks   = map[string]func(payload []byte) error{}
)

// RegisterPayloadCheck makes check the test of kind's payloads that [CheckPayload] runs:
// why the connector would refuse a payload on every attempt, without sending anything.
// Connector packages register theirs when they are imported, as database/sql drivers
// do, so that a program that delivers with a connector also refuses, at enqueue, what
// it would refuse, without every program that enqueues depending on every SDK.
func RegisterPayloadCheck(kind string, check func(payload []byte) error) {
	payloadChecksMu.Lock()
	defer payloadChecksMu.Unlock()
	payloadChecks[kind] = check
}

// CheckPayload runs kind's registered payload check, if any.
func CheckPayload(kind string, payload []byte) error {
	payloadChecksMu.RLock()
	check := payloadChecks[kind]
	payloadChecksMu.RUnlock()
	if check == nil {
		return nil
	}
	return check(payload)
}
