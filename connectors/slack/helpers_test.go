package slack_test

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/connectors"
)

// retryReconciles sends d again as the retry after an ambiguous attempt (attempt 2) and
// checks that it found the message the first attempt posted: reconciled, and still one
// message with d's key.
func retryReconciles(t *testing.T, b *testBundle, d connectors.Delivery) json.RawMessage {
	t.Helper()
	d.Attempt, d.PreviousAmbiguous = 2, true
	raw, err := b.c.Deliver(t.Context(), d)
	require.NoError(t, err)
	require.True(t, decodeResult(t, raw).Reconciled, "%s", raw)
	require.Equal(t, 1, b.f.Effects(d.Key), "the retry posted a second message")
	return raw
}

// messageOrReply is the delivery of key: a reply in a thread started for it when thread
// is true, else a message of the channel.
func messageOrReply(t *testing.T, b *testBundle, key string, thread bool) connectors.Delivery {
	t.Helper()
	if !thread {
		return delivery(key)
	}
	_, reply := startThread(t, b)
	return reply(key)
}
