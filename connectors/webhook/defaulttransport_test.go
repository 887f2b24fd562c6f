package webhook_test

import (
	"net/http"
	"os"
	"os/exec"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/connectors/webhook"
	"github.com/outboxd/outboxd/internal/receiver"
)

// replacedDefaultTransportVar makes the test binary run
// TestNew_ReplacedDefaultTransport's child part: a process of its own, because the
// shared transport is built once per process and http.DefaultTransport is global.
const replacedDefaultTransportVar = "OUTBOX_WEBHOOK_TEST_REPLACED_DEFAULT_TRANSPORT"

// wrappingTransport stands for what an application may put in http.DefaultTransport: an
// instrumenting wrapper, a test's mock.
type wrappingTransport struct{ http.RoundTripper }

// An application that embeds the relay may have replaced http.DefaultTransport, which is
// a RoundTripper variable. Building a connector must not panic then, with a Client of
// its own or without one.
func TestNew_ReplacedDefaultTransport(t *testing.T) {
	t.Parallel()
	if os.Getenv(replacedDefaultTransportVar) == "" {
		child := exec.CommandContext(t.Context(), os.Args[0], "-test.run=^TestNew_ReplacedDefaultTransport$", "-test.v")
		child.Env = append(os.Environ(), replacedDefaultTransportVar+"=1")
		out, err := child.CombinedOutput()
		require.NoError(t, err, "%s", out)
		require.Contains(t, string(out), "--- PASS: TestNew_ReplacedDefaultTransport")
		return
	}

	http.DefaultTransport = wrappingTransport{http.DefaultTransport}
	r, err := receiver.Start(receiver.Options{})
	require.NoError(t, err)
	t.Cleanup(r.Close)

	// The own client first: it must not need the shared transport at all.
	for _, cfg := range []webhook.Config{
		{URL: r.URL(), Client: testClient(t)},
		{URL: r.URL()},
	} {
		c, err := webhook.New(cfg)
		require.NoError(t, err, "%v", cfg)
		_, err = c.Deliver(t.Context(), delivery("k"))
		require.NoError(t, err, "%v", cfg)
	}
	require.Equal(t, 2, r.Requests("k"))
}
