package connectors_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/connectors"
)

// encoding/json matches field names without regard to case, with Unicode folding, and
// the last match wins: "paramſ" (a long s) replaced "params", the value validation
// checked and an approver saw. A row written by plain SQL never went through validation,
// so the connectors refuse such a payload themselves.
func TestDecodeObjectMatchesNamesExactly(t *testing.T) {
	t.Parallel()
	type payload struct {
		Operation string         `json:"operation"`
		Params    map[string]int `json:"params"`
		Ignored   string         `json:"-"`
	}
	var p payload
	require.NoError(t, connectors.DecodeObject([]byte(`{"operation":"x","params":{"amount":100}}`), &p))
	require.Equal(t, payload{Operation: "x", Params: map[string]int{"amount": 100}}, p)

	for raw, want := range map[string]string{
		`{"operation":"x","params":{"amount":100},"paramſ":{"amount":99999900}}`: `field "paramſ" is not one of operation, params`,
		`{"Operation":"x","params":{}}`:                                          `field "Operation" is not one of`,
		`{"operation":"x","note":"y"}`:                                           `unknown field "note"`,
		`{"operation":"x"} {}`:                                                   "more than one JSON value",
		`{"operation":"x","-":"y"}`:                                              `unknown field "-"`,
	} {
		var p payload
		require.ErrorContains(t, connectors.DecodeObject([]byte(raw), &p), want, raw)
	}
}

// A value that is not an object is refused: encoding/json decodes null into a struct as
// nothing at all.
func TestDecodeExactRefusesWhatIsNotAnObject(t *testing.T) {
	var v struct {
		A int `json:"a"`
	}
	for _, raw := range []string{`null`, ` null `, `[]`, `1`, `"a"`} {
		require.ErrorContains(t, connectors.DecodeExact([]byte(raw), &v), "not a JSON object", raw)
	}
	require.NoError(t, connectors.DecodeExact([]byte(` {"a":1} `), &v))
	require.Equal(t, 1, v.A)
}

// A field whose type decodes itself (time.Time) fails without saying which field it was;
// the error names it. Syntax and type errors keep what encoding/json says.
func TestDecodeExactNamesTheFieldThatFailed(t *testing.T) {
	t.Parallel()
	type request struct {
		Connector string     `json:"connector"`
		NotBefore *time.Time `json:"not_before,omitempty"`
		Count     int        `json:"count"`
	}
	for raw, want := range map[string]string{
		`{"connector":"x","not_before":"tomorrow"}`:             `field "not_before": parsing time "tomorrow"`,
		`{"not_before":5,"connector":"x"}`:                      `field "not_before": Time.UnmarshalJSON: input is not a JSON string`,
		`{"connector":"x","count":"5"}`:                         `Go struct field request.count of type int`,
		`{"connector":"x","count":1,"not_before":"2"}`:          `field "not_before": parsing time "2"`,
		`{"connector":"x","not_before":"2026-13-01T00:00:00Z"}`: `field "not_before": parsing time "2026-13-01T00:00:00Z": month out of range`,
	} {
		var r request
		require.ErrorContains(t, connectors.DecodeExact([]byte(raw), &r), want, raw)
	}
}
