package ops_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/internal/ops"
	"github.com/outboxd/outboxd/internal/pgtest"
	"github.com/outboxd/outboxd/outbox"
)

// Status says which connectors a running relay has, from the relays' words in
// outbox_wake_connectors, so that an operator can tell rows waiting for a relay that
// does not run (a connector no relay was configured with, one whose relays all
// stopped, a demo killed on this database) from a slow one: it said only "backlog
// growing", a minute after a row was due, and nothing of rows due later.
func TestStatusSaysWhichConnectorsARunningRelayHas(t *testing.T) {
	t.Parallel()
	pool := pgtest.DB(t)
	ctx := t.Context()
	insertRow(t, pool, row{Key: "wh-1", Age: time.Minute})
	insertRow(t, pool, row{Key: "sl-1", Connector: "slack", Age: time.Minute, NextAttemptIn: time.Hour})
	insertRow(t, pool, row{Key: "em-1", Connector: "email", Status: outbox.StatusDelivering, LeaseIn: -time.Minute, Age: time.Minute})
	insertRow(t, pool, row{Key: "pay-1", Connector: "payment", Status: outbox.StatusDelivered, Age: time.Minute})
	// A relay with webhook runs; slack's relay stopped a minute ago (its word lapsed);
	// no relay ever said it has email or payment.
	_, err := pool.Exec(ctx, `INSERT INTO outbox_wake_connectors (connector, relay_id, seen_until)
VALUES ('webhook', 'r1', $1), ('slack', 'r2', $2)`, base.Add(time.Minute), base.Add(-time.Minute))
	require.NoError(t, err)

	rep, err := ops.Status(ctx, pool, base)
	require.NoError(t, err)
	by := map[string]ops.ConnectorStatus{}
	for _, c := range rep.Connectors {
		by[c.Connector] = c
	}
	require.Len(t, by, 4)
	for name, want := range map[string]bool{"webhook": true, "slack": false, "email": false, "payment": false} {
		require.NotNil(t, by[name].RelayRunning, name)
		require.Equal(t, want, *by[name].RelayRunning, name)
	}
	require.False(t, by["webhook"].WaitsForARelay())
	require.True(t, by["slack"].WaitsForARelay())    // pending, due later
	require.True(t, by["email"].WaitsForARelay())    // stuck in delivering
	require.False(t, by["payment"].WaitsForARelay()) // nothing waits

}
