package relay

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/outbox"
)

// Until a starting relay's word that it has its instances commits, inserts of them send
// no NOTIFY while another relay polls fast for its own instances; the relay must look
// for rows once its word is written. It used to wait for its next poll (here an hour),
// so a row inserted between its first claims and its word waited that long.
func TestRelayLooksForRowsOnceItsWordIsWritten(t *testing.T) {
	t.Parallel()
	direct, proxy, cfg, _ := lossySetup(t)
	cfg.PollInterval = time.Hour
	conn := &recordingConnector{}
	// Another relay polls fast for its instance, webhook:a.
	_, err := direct.Exec(t.Context(), `INSERT INTO outbox_wake_connectors (connector, relay_id, seen_until, polling_until)
		VALUES ('webhook:a', 'other', 'infinity', 'infinity')`)
	require.NoError(t, err)
	held, release := proxy.holdOnce(t, "relay_id, seen_until)") // seenSQL
	r, _ := start(t, proxy.pool, cfg, map[string]Instance{"webhook": {Connector: conn}})
	<-held
	require.Eventually(t, func() bool { return testutil.ToFloat64(r.metrics.notifyWorking) == 1 }, waitTimeout, 10*time.Millisecond,
		"the relay listens and has looked for rows")

	enqueue(t, direct, "early", "webhook", map[string]int{"n": 1}) // no NOTIFY
	release()
	waitStatus(t, direct, "early", outbox.StatusDelivered)
}
