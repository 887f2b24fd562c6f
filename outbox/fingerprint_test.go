package outbox

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestCanonicalJSON(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct{ in, want string }{
		{`{"b":1,"a":2}`, `{"a":2,"b":1}`},
		{" { \"a\" : [ 1 , 2.0, 3e2, -0, 0.5, 1.50 ] } ", `{"a":[1,2,300,0,0.5,1.5]}`},
		{`123456789012345678901234567890`, `123456789012345678901234567890`},
		{`{"a":{"z":null,"y":true}}`, `{"a":{"y":true,"z":null}}`},
	} {
		v, err := decodeJSON([]byte(tt.in))
		require.NoError(t, err)
		require.Equal(t, tt.want, string(canonicalJSON(v)), tt.in)
	}
}

func TestFingerprint(t *testing.T) {
	t.Parallel()
	fp := func(connector, ordering, payload string) []byte {
		v, err := decodeJSON([]byte(payload))
		require.NoError(t, err)
		return fingerprint(connector, ordering, canonicalJSON(v))
	}
	base := fp("webhook", "", `{"a":1,"b":[1,2]}`)
	require.Equal(t, base, fp("webhook", "", `{ "b": [1, 2.0], "a": 1 }`))
	require.NotEqual(t, base, fp("webhook:crm", "", `{"a":1,"b":[1,2]}`))
	require.NotEqual(t, base, fp("webhook", "o", `{"a":1,"b":[1,2]}`))
	require.NotEqual(t, base, fp("webhook", "", `{"a":1,"b":[2,1]}`))
	// The separators keep fields apart.
	require.NotEqual(t, fp("webhook", "x", `{}`), fp("webhookx", "", `{}`))
}

func FuzzFingerprint(f *testing.F) {
	f.Add([]byte(`{"b":1,"a":[1.0,"x",{"c":null}]}`))
	f.Add([]byte(`[1e3, -0.0, 12345678901234567890]`))
	f.Add([]byte(`"\u00e9"`))
	f.Fuzz(func(t *testing.T, raw []byte) {
		v, err := decodeJSON(raw)
		if err != nil {
			return
		}
		canon := canonicalJSON(v)

		// Canonical form is a fixed point, and valid JSON.
		v2, err := decodeJSON(canon)
		require.NoError(t, err)
		require.Equal(t, string(canon), string(canonicalJSON(v2)))

		// Whitespace does not change the fingerprint.
		var indented bytes.Buffer
		require.NoError(t, json.Indent(&indented, raw, " ", "\t"))
		v3, err := decodeJSON(indented.Bytes())
		require.NoError(t, err)
		require.Equal(t, fingerprint("webhook", "", canon), fingerprint("webhook", "", canonicalJSON(v3)))
	})
}
