package ops_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/internal/ops"
	"github.com/outboxd/outboxd/internal/pgtest"
	"github.com/outboxd/outboxd/outbox"
)

// Plain SQL writes a row's headers as it likes (Traceparent, a number for a value), and
// the webhook connector sends them. replay --new-key enqueued the copy through
// outbox.Enqueue, which takes lowercase names only, after reading the headers into a
// map of strings, which a number fails: either way the whole replay failed, for the
// other rows too. Such headers are copied as the connector sends them, and a row whose
// copy Enqueue still refuses is refused alone.
func TestReplayNewKeyCopiesHeadersPlainSQLWrote(t *testing.T) {
	t.Parallel()
	pool := pgtest.DB(t)
	const trace = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	_, err := pool.Exec(t.Context(), `INSERT INTO outbox (idempotency_key, connector, payload, headers, status, attempts)
		VALUES ('notify', 'webhook', '{}', jsonb_build_object('Traceparent', $1::text), 'dead', 1),
		       ('counted', 'webhook', '{}', '{"x-count": 5}', 'dead', 1),
		       ('underscore', 'webhook', '{}', '{"x_trace": "a"}', 'dead', 1),
		       ('twice', 'webhook', '{}', '{"Traceparent": "a", "traceparent": "b"}', 'dead', 1),
		       ('plain', 'webhook', '{}', '{}', 'dead', 1)`, trace)
	require.NoError(t, err)

	res, err := ops.Replay(t.Context(), pool, ops.Selection{Keys: []string{"notify", "counted", "underscore", "twice", "plain"}},
		ops.ReplayOptions{Actor: "op", NewKey: true, Now: base})
	require.NoError(t, err)
	require.ElementsMatch(t, []string{"notify", "counted", "plain"}, res.Replayed, "%+v", res)
	require.Contains(t, res.Refused["underscore"], `header name "x_trace"`)
	require.Contains(t, res.Refused["twice"], `"traceparent" twice`)

	for key, want := range map[string]map[string]string{
		"notify":  {"traceparent": trace},
		"counted": {"x-count": "5"},
		"plain":   nil,
	} {
		in, err := outbox.Get(t.Context(), pool, res.NewKeys[key])
		require.NoError(t, err)
		require.Equal(t, want, in.Headers, "the copy of %s carries its headers", key)
	}
}
