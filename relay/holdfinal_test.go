package relay

import (
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/connectors"
	"github.com/outboxd/outboxd/connectors/webhook"
	"github.com/outboxd/outboxd/internal/receiver"
	"github.com/outboxd/outboxd/outbox"
)

// An attempt that is ambiguous and also final (the webhook's 303 See Other: the receiver
// took the request and may have acted, and a retry cannot change its answer) on a
// forwarded instance with the hold policy went to dead: the relay decided alone, and the
// next row of its ordering key went out, though the operator had asked to be the one
// who decides after an ambiguous attempt. It is held, as any ambiguous attempt of such
// an instance is, and its key waits.
func TestAmbiguousFinalAnswerIsHeldWithTheHoldPolicy(t *testing.T) {
	t.Parallel()
	b := setup(t, receiver.Options{})
	var seen atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen.Add(1)
		if r.Header.Get("Idempotency-Key") == "took-it" {
			http.Redirect(w, r, "/orders/42", http.StatusSeeOther)
			return
		}
		w.WriteHeader(http.StatusOK)
	}))
	t.Cleanup(srv.Close)
	hook, err := webhook.New(webhook.Config{URL: srv.URL + "/hook", Guarantee: connectors.Forwarded, Timeout: 5 * time.Second})
	require.NoError(t, err)
	start(t, b.pool, b.fastConfig(), map[string]Instance{"webhook": {Connector: hook, OnAmbiguous: AmbiguousHold}})
	enqueueOrdered(t, b.pool, "took-it", "order-42")
	enqueueOrdered(t, b.pool, "next", "order-42")

	require.Eventually(t, func() bool { return len(attemptsOf(t, b.pool, "took-it")) == 1 }, waitTimeout, 10*time.Millisecond)
	in, err := outbox.Get(t.Context(), b.pool, "took-it")
	require.NoError(t, err)
	t.Logf("status=%s last_error=%q", in.Status, in.LastError)
	require.Equal(t, outbox.StatusHeld, in.Status)
	require.Contains(t, in.LastError, "it may have acted")
	require.Contains(t, in.LastError, "held: replay or cancel it")
	att := attemptsOf(t, b.pool, "took-it")
	require.Equal(t, outbox.StatusHeld, att[0].Outcome)
	require.True(t, att[0].Ambiguous)
	next, err := outbox.Get(t.Context(), b.pool, "next")
	require.NoError(t, err)
	require.Equal(t, outbox.StatusPending, next.Status, "the key's next row waits for the operator")
	require.EqualValues(t, 1, seen.Load())
}
