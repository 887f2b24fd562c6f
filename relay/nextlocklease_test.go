package relay

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/connectors"
	"github.com/outboxd/outboxd/connectors/webhook"
	"github.com/outboxd/outboxd/internal/receiver"
	"github.com/outboxd/outboxd/outbox"
)

// Another session keeps the next row of an ordering key locked (an application's
// transaction, psql's BEGIN; SELECT ... FOR UPDATE left open) while the key's head is
// delivered. The head's own row is not locked: only the release of the next row
// (lockNextSQL) waits for the lock. The relay that delivered the head knows it was
// delivered, but withheld the whole outcome for as long as the next row stayed locked;
// once the head's lease had run out, another relay's reclaim took the head for an
// abandoned attempt (ambiguous), put it back and claimed it again: a second effect at a
// receiver that does not enforce the key, for a row whose delivery was known.
func TestNextRowLockedPastTheLeaseDoesNotResendADeliveredHead(t *testing.T) {
	t.Parallel()
	b := setup(t, receiver.Options{IgnoreKeys: true})
	forwarded, err := webhook.New(webhook.Config{URL: b.receiver.URL(), Guarantee: connectors.Forwarded, Timeout: 5 * time.Second})
	require.NoError(t, err)
	instances := map[string]Instance{"webhook": {Connector: forwarded}}
	clock, cfg := b.clockedConfig(t)
	cfg.Lease = 10 * time.Second
	sender, other := newRelayAs(t, b, cfg, instances, "sender"), newRelayAs(t, b, cfg, instances, "other")
	enqueueOrdered(t, b.pool, "head", "order-7")
	next := enqueueOrdered(t, b.pool, "next", "order-7")
	locker := lockRow(t, b.pool, next.ID)

	got := claimRows(t, sender, "webhook")
	require.Equal(t, []string{"head"}, claimedKeys(got))
	inst := sender.instances["webhook"]
	res, err := forwarded.Deliver(t.Context(), connectors.Delivery{Key: "head", Attempt: 1, Payload: got[0].payload})
	require.NoError(t, err)
	require.Equal(t, 1, b.receiver.Effects("head"))
	o := sender.decide(inst, got[0], res, nil, clock.Now())
	o.started = got[0].claimedAt
	// As the claim loop writes it: the write meets the lock on the next row, waits its
	// second, and what cannot be written is set aside.
	var locked lockWaits[outcome]
	sender.writeBatch(t.Context(), []outcome{o}, &locked)

	// The lock is kept past the head's lease; another relay looks for expired leases.
	clock.Advance(cfg.Lease + time.Minute)
	other.reclaim(t.Context())

	in, err := outbox.Get(t.Context(), b.pool, "head")
	require.NoError(t, err)
	require.NotEqual(t, outbox.StatusPending, in.Status,
		"the head, delivered, was put back for another attempt: %s", in.LastError)
	require.Empty(t, claimedKeys(claimRows(t, other, "webhook")), "the delivered head is claimed again, to be sent twice")
	require.Equal(t, outbox.StatusDelivered, in.Status)
	require.Equal(t, 1, b.receiver.Effects("head"))

	// Once let go, the next row goes.
	require.NoError(t, locker.Rollback(t.Context()))
	require.Equal(t, []string{"next"}, claimedKeys(claimRows(t, other, "webhook")))
}
