package outbox

import (
	"bytes"
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/internal/pgtest"
)

// The size checkStorable bounds a value's jsonb with is never less than PostgreSQL's
// (its binary form, without the 4-byte length in front), nor far more.
func TestJsonbSizeBoundsPostgreSQLs(t *testing.T) {
	t.Parallel()
	tx := pgtest.Tx(t)
	for _, doc := range []string{
		`{}`, `[]`, `"x"`, `1`, `true`, `null`, `{"a":1}`, `[1,2,3]`, `[true,false,null]`,
		`{"id":"evt_1","amount":1999,"currency":"usd","items":[{"sku":"a","qty":2},{"sku":"bb","qty":1.5}]}`,
		`[[[[[[[[[["deep"]]]]]]]]]]`, `{"é":"ünïcödé 注文","n":-12345.6789e-3,"z":0e-16383}`,
		`[1e131071, 1e-16383, 0.1, 10000, 99999999]`, `{"a":{"b":{"c":[1,{"d":"e"}]}},"f":[[],{}]}`,
		`"` + strings.Repeat("s", 5000) + `"`, `[` + strings.Repeat(`7,`, 999) + `7]`,
	} {
		var pg int64
		require.NoError(t, tx.QueryRow(t.Context(), `SELECT pg_column_size($1::jsonb)`, doc).Scan(&pg))
		v, err := decodeJSON([]byte(doc))
		require.NoError(t, err)
		st := checkStorable(v)
		require.Empty(t, st.tooLarge, doc)
		require.GreaterOrEqual(t, st.size, pg-4, "%.60s is %d bytes in jsonb", doc, pg)
		require.LessOrEqual(t, st.size, 2*pg+16, "%.60s is %d bytes in jsonb", doc, pg)
	}
}

// jsonbCounts names an array of more than 2^24 elements and an object of more than 2^23
// members (duplicate names included, as jsonb_in counts them), at any depth, and not an
// array at the limit (an object's count is the same code); commas inside strings are
// not counted.
func TestJsonbCountsNamesWhatJsonbCannotHold(t *testing.T) {
	t.Parallel()
	array := func(n int) []byte { // [0,0,...]
		b := append([]byte("["), bytes.Repeat([]byte("0,"), n)...)
		b[len(b)-1] = ']'
		return b
	}
	object := func(n int) []byte { // {"":0,"":0,...}
		b := append([]byte("{"), bytes.Repeat([]byte(`"":0,`), n)...)
		b[len(b)-1] = '}'
		return b
	}
	require.Equal(t, "an array of more than 16777216 elements", jsonbCounts(array(jsonbMaxElems+1)))
	require.Empty(t, jsonbCounts(array(jsonbMaxElems)))
	require.Equal(t, "an object of more than 8388608 members (duplicate names included)", jsonbCounts(object(jsonbMaxMembers+1)))

	// Deeper down; and commas in a string (after an escaped quote and backslash) are text.
	nested := slices.Concat([]byte(`{"a":[1,{"b":`), array(jsonbMaxElems+1), []byte(`}],"c":2}`))
	require.Equal(t, "an array of more than 16777216 elements", jsonbCounts(nested))
	text := slices.Concat([]byte(`{"a":[1,{"b":["\"\\`), bytes.Repeat([]byte(","), jsonbMaxElems), []byte(`"]}]}`))
	require.True(t, json.Valid(text))
	require.Empty(t, jsonbCounts(text))
}

// What jsonb cannot hold for its size is named, and what it can is not (PostgreSQL
// itself refuses the first: see TestPayloadPastJsonbLimitsKeepsTxUsable).
func TestStorableNamesWhatJsonbCannotHold(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("s", jsonbMaxLen+1)
	require.Equal(t, "a string of 268435456 bytes (at most 268435455)", checkStorable(map[string]any{"s": long}).tooLarge)
	require.Contains(t, checkStorable(map[string]any{"s": long[1:]}).tooLarge, "bytes in jsonb's binary form (at most 268435455)",
		"the string fits, its object does not")
	require.Empty(t, checkStorable(map[string]any{"s": long[:jsonbMaxLen/2]}).tooLarge)

	// 1,024 strings of 256 kB with their entries pass 256 MiB; 1,023 do not.
	parts := make([]any, 1024)
	for i := range parts {
		parts[i] = long[:1<<18]
	}
	require.Contains(t, checkStorable(parts).tooLarge, "bytes in jsonb's binary form (at most 268435455)")
	require.Empty(t, checkStorable(parts[:1023]).tooLarge)
	require.Contains(t, checkStorable(map[string]any{"a": parts[:512], "b": parts[:512]}).tooLarge, "bytes in jsonb's binary form",
		"nested")
}
