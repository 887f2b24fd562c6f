package main

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/internal/pgcluster"
)

// TestDemo runs `outboxd demo` end to end, as the README's first command does: a
// throwaway PostgreSQL, the relay and a receiver, a few seconds.
func TestDemo(t *testing.T) {
	t.Parallel()

	type testBundle struct {
		environ []string
	}
	setup := func(t *testing.T) *testBundle {
		t.Helper()
		if _, err := pgcluster.FindBinDir(); err != nil {
			t.Fatalf("the demo needs the PostgreSQL server binaries (apt-get install postgresql): %v", err)
		}
		return &testBundle{}
	}
	check := func(t *testing.T, environ []string) string {
		t.Helper()
		var stdout, stderr bytes.Buffer
		code := run(t.Context(), []string{"demo"}, environ, strings.NewReader(""), &stdout, &stderr)
		out := stdout.String()
		require.Equal(t, exitOK, code, "stdout:\n%s\nstderr:\n%s", out, stderr.String())

		lines := strings.Split(strings.TrimSpace(out), "\n")
		require.Equal(t, demoSuccess, lines[len(lines)-1], "the success line comes last")
		// Each attempt is printed as it happens: the dropped connection, its retry that
		// gets the stored answer, the two 503s, the permanent refusal.
		require.Contains(t, out, "attempt 1 ambiguous (the receiver may have acted), will retry with the same key")
		require.Contains(t, out, "attempt 2 delivered (200: the receiver answered from its stored result, no second effect)")
		require.Contains(t, out, "attempt 2 failed, will retry with the same key")
		require.Contains(t, out, "attempt 3 delivered (200)")
		// The end state: the dead row with its reason.
		var dead string
		for _, l := range lines {
			if strings.Contains(l, "/order-1004/post-invoice~") && strings.Contains(l, " dead ") {
				dead = l
			}
		}
		require.NotEmpty(t, dead, "the end state lists the dead row:\n%s", out)
		require.Contains(t, dead, "receiver answered 422 Unprocessable Entity")
		require.Contains(t, dead, "(permanent: not retried)")
		require.NotContains(t, out, "PROBLEM")
		return out
	}

	t.Run("ThrowawayCluster", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		out := check(t, b.environ)
		require.Contains(t, out, "database: starting a throwaway PostgreSQL")
	})

	t.Run("DatabaseURL", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		cluster, err := pgcluster.Start(t.Context(), pgcluster.Options{})
		require.NoError(t, err)
		t.Cleanup(func() { require.NoError(t, cluster.Stop()) })
		b.environ = []string{"OUTBOX_DATABASE_URL=" + cluster.URL("postgres")}

		out := check(t, b.environ)
		require.Contains(t, out, "database: OUTBOX_DATABASE_URL (")
		require.Contains(t, out, "relay instance webhook:demo_")

		// A second run in the same database keeps to its own rows.
		check(t, b.environ)
	})
}

func TestDemoHelp(t *testing.T) {
	t.Parallel()

	var stdout, stderr bytes.Buffer
	code := run(context.Background(), []string{"demo", "--help"}, nil, strings.NewReader(""), &stdout, &stderr)
	require.Equal(t, exitOK, code, stderr.String())
	require.Contains(t, stdout.String(), "Examples:\n")
	require.Contains(t, stdout.String(), "  outboxd demo\n")
}
