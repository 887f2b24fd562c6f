package payment_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/connectors"
)

// A null inside a list or in metadata has no Stripe form encoding. Before the fix it was
// dropped without a word: [null] sent no payment_method_types at all (Stripe then picks
// its defaults), [null,"customer"] sent only expand[1], and a null metadata value went
// out as an empty string, which Stripe reads as "unset this key". The row must be
// refused, permanently, before anything is sent.
func TestDeliver_NullInListOrMetadataIsRefused(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, tc := range []struct{ name, payload, contains string }{
		{"ListElement", `{"operation":"payment_intent.create","params":{"amount":2000,"currency":"usd","payment_method_types":[null]}}`, "params.payment_method_types[0]: null"},
		{"ListElementAmongOthers", `{"operation":"payment_intent.create","params":{"amount":2000,"currency":"usd","expand":[null,"customer"]}}`, "params.expand[0]: null"},
		{"MetadataValue", `{"operation":"customer.create","params":{"metadata":{"order":null}}}`, "params.metadata.order: null"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			key := "null-" + tc.name
			_, err := b.c.Deliver(t.Context(), delivery(key, tc.payload))
			require.Error(t, err, "a null that cannot be sent must not be dropped silently")
			require.True(t, connectors.IsPermanent(err), "%v", err)
			require.Contains(t, err.Error(), tc.contains)
			require.Empty(t, b.f.Requests(key), "nothing was sent")
		})
	}
}
