package payment_test

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
)

// Enqueue and the intent API compare payloads by value ("1, 1.0 and 1e0 are all 1":
// {"amount":100.0} is the same request as {"amount":100}), and jsonb keeps a number's
// scale, so the relay reads {"amount":2000.0} back as written. A JSON number whose value
// is a whole number is that integer; the connector refused it as "a JSON number 2000.0
// cannot go in Amount", and the row went dead, while the same request spelt 2000 is paid.
// A fraction (0.5) is still refused.
func TestDeliver_IntegralNumberIsAnInteger(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for i, amount := range []string{"2000.0", "2e3", "2.000E+3", "9007199254740993.0"} {
		key := fmt.Sprintf("integral:%d", i)
		payload := fmt.Sprintf(`{"operation":"payment_intent.create","params":{"amount":%s,"currency":"usd"}}`, amount)
		_, err := b.c.Deliver(t.Context(), delivery(key, payload))
		require.NoError(t, err, "amount %s", amount)
		reqs := b.f.Requests(key)
		require.Len(t, reqs, 1)
		want := "2000"
		if amount == "9007199254740993.0" {
			want = "9007199254740993"
		}
		require.Equal(t, want, reqs[0].Form.Get("amount"), "amount %s", amount)
	}
	_, err := b.c.Deliver(t.Context(), delivery("integral:fraction", `{"operation":"payment_intent.create","params":{"amount":0.5,"currency":"usd"}}`))
	require.Error(t, err)
	require.Empty(t, b.f.Requests("integral:fraction"))
}
