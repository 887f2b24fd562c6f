package outbox_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/internal/pgtest"
	"github.com/outboxd/outboxd/outbox"
)

// jsonb keeps a number's value and its scale as written, and PostgreSQL writes it out in
// full: 0e-16383 (8 bytes) as "0." and 16,383 zeros, 1e131071 as a 1 and 131,071 zeros.
// A payload of a few kilobytes could so stand for gigabytes of text, which every claim
// of its row has PostgreSQL write out (the claim reads the payload): past 1 GiB it
// cannot ("out of memory"), the claim fails, and with it every round of every relay on
// the database, all connector instances' claims and outcomes together, for as long as
// the row is pending. Enqueue (and the intent API, MCP and outboxd enqueue through it)
// took such a payload: an intent API token's 1 MiB request could stop every delivery.
// Numbers may now add at most 16 MiB to a payload's text; the transaction stays usable.
func TestNumbersWrittenOutInFullAreBounded(t *testing.T) {
	t.Parallel()
	numbers := func(n int, number string) json.RawMessage {
		return json.RawMessage("[" + strings.TrimSuffix(strings.Repeat(number+",", n), ",") + "]")
	}
	for name, payload := range map[string]json.RawMessage{
		// 1,100 × 16,377 bytes more than written: 17.2 MB from 9.9 kB.
		"fractions written out": numbers(1100, "0e-16383"),
		// 130 × 131,064 bytes more: 17.0 MB from 1.2 kB.
		"integers written out": numbers(130, "1e131071"),
		"mixed, in objects": json.RawMessage(`{"a":` + string(numbers(600, "0e-16383")) +
			`,"b":{"c":` + string(numbers(600, "-5e-16383")) + `}}`),
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			tx := pgtest.Tx(t)
			_, err := outbox.Enqueue(ctx, tx, webhookMsg("k", payload))
			require.ErrorIs(t, err, outbox.ErrInvalidMessage)
			require.ErrorContains(t, err, "writes out in full")
			require.Equal(t, 0, countRows(t, tx), "the transaction is still usable")

			_, err = outbox.EnqueueBatch(ctx, tx, []outbox.Message{webhookMsg("fine", []int{1}), webhookMsg("k", payload)})
			require.ErrorIs(t, err, outbox.ErrInvalidMessage)
			require.Equal(t, 0, countRows(t, tx), "the transaction is still usable")
		})
	}
	for name, payload := range map[string]json.RawMessage{
		// 1,000 × 16,377 bytes: 15.6 MiB more, within the bound.
		"numbers within the bound": numbers(1000, "0e-16383"),
		// Large payloads are bounded by what they are, not by this rule.
		"a large payload without such numbers": json.RawMessage(`{"s":"` + strings.Repeat("x", 20<<20) + `"}`),
		"many ordinary numbers":                numbers(200_000, "1234.5678e-2"),
	} {
		t.Run("ok "+name, func(t *testing.T) {
			t.Parallel()
			in, err := outbox.Enqueue(t.Context(), pgtest.Tx(t), webhookMsg("k", payload))
			require.NoError(t, err)
			require.True(t, in.Inserted)
		})
	}
}
