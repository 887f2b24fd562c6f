package api_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/internal/intent"
	"github.com/outboxd/outboxd/internal/pgtest"
)

// endSessionAt ends, once armed, the session about to send a statement that holds at:
// PostgreSQL terminates its backend (57P01), as a restart or a failover does.
type endSessionAt struct {
	t     *testing.T
	admin *pgxpool.Pool
	at    string
	armed atomic.Bool
}

func (e *endSessionAt) TraceQueryStart(ctx context.Context, conn *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	if strings.Contains(data.SQL, e.at) && e.armed.CompareAndSwap(true, false) {
		// On the request's goroutine, not the test's: Errorf, since FailNow may not be
		// called here.
		var ended bool
		err := e.admin.QueryRow(context.WithoutCancel(ctx),
			`SELECT pg_terminate_backend($1, 10000)`, conn.PgConn().PID()).Scan(&ended)
		if err != nil || !ended {
			e.t.Errorf("end session %d: ended=%v err=%v", conn.PgConn().PID(), ended, err)
		}
	}
	return ctx
}

func (e *endSessionAt) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// The same request retried by a token whose connectors changed between "*" and a list
// (its ordering key stored in the other form) is found by a second look at the key's row.
// A database lost during that look is a 503, as anywhere else: it answered 422, "already
// used for a different request ... use a new key for a new decision", and a client that
// did so had the operation performed twice.
func TestScopeChangeReplayLosingTheDatabaseIs503(t *testing.T) {
	t.Parallel()
	admin := pgtest.DB(t)
	end := &endSessionAt{t: t, admin: admin, at: "FROM outbox WHERE idempotency_key = $1"}
	cfg := admin.Config().Copy()
	cfg.ConnConfig.Tracer = end
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)

	req := intent.CreateRequest{Connector: "webhook:crm", Payload: json.RawMessage(`{"n":1}`), OrderingKey: "customer-42"}
	scoped := intent.Token{Name: "crm", SHA256: hash(crmSecret), Connectors: []string{"webhook:crm"}}
	first, err := (&intent.Service{Pool: pool, Policy: &intent.Policy{}}).Create(t.Context(), &scoped, "k-1", req)
	require.NoError(t, err)
	require.Equal(t, "token:crm/customer-42", first.OrderingKey)

	// The operator widened the token to every connector since.
	widened := scoped
	widened.Connectors = []string{"*"}
	b := serveAPI(t, pool, &intent.Service{Pool: pool, Policy: &intent.Policy{Tokens: []intent.Token{widened}}}, nil)
	body := `{"connector":"webhook:crm","payload":{"n":1},"ordering_key":"customer-42"}`

	end.armed.Store(true)
	r := b.do(t, http.MethodPost, "/v1/intents", crmSecret, "k-1", body)
	require.False(t, end.armed.Load(), "the key's row was not looked up again")
	requireUnavailable(t, r, "the same request, losing the database as its row is looked up again")

	// Sent again, it is the intent written before.
	r = b.do(t, http.MethodPost, "/v1/intents", crmSecret, "k-1", body)
	require.Equal(t, http.StatusOK, r.status, r.raw)
	require.Equal(t, "true", r.header.Get("Idempotent-Replayed"))
	require.EqualValues(t, first.ID, r.body["id"])
}
