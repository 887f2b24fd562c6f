package relay

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

// releaseWhileStopping runs under recordCtx, which Run cancels when the drain time is
// up, and then waits for it. The releases it retried ran under context.Background() with
// 10 s each, so against a database that does not answer, Run returned up to 20 s after it
// cancelled recordCtx (the README bounds a stop by the drain time). They end with its context now:
// here it is cancelled once the release has connected to a listener that never answers,
// and the call must return before a release's own 10 s limit could have ended it.
func TestReleaseWhileStoppingEndsWithItsContext(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var conns []net.Conn
	accepted := make(chan struct{})
	go func() {
		c, err := ln.Accept() // a database that never answers
		if err == nil {
			conns = append(conns, c)
			close(accepted)
		}
	}()
	pool, err := pgxpool.New(context.Background(), "postgres://u@"+ln.Addr().String()+"/db?sslmode=disable")
	require.NoError(t, err)
	defer pool.Close()
	r, err := New(pool, &Config{}, map[string]Instance{"webhook": {Connector: newHook(t, "http://127.0.0.1:1/")}})
	require.NoError(t, err)
	r.unreleased = []claimed{{id: 1, attempt: 1, lease: time.Now()}}
	r.anyUnreleased.Store(true)
	done := make(chan struct{})
	close(done) // the workers are done
	returned := make(chan struct{})
	go func() { r.releaseWhileStopping(ctx, done); close(returned) }()
	<-accepted
	cancel() // Run's drain time is up: cancelRecords
	start := time.Now()
	<-returned
	require.Less(t, time.Since(start), 10*time.Second, "releaseWhileStopping ended only with a release's own time limit, not with its context")
	for _, c := range conns {
		c.Close()
	}
}
