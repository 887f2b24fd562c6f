package slack_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/connectors"
	"github.com/outboxd/outboxd/connectors/connectortest"
	"github.com/outboxd/outboxd/connectors/slack"
)

// An HTTP 200 without end (a proxy streaming a file, a stand-in gone wrong): the
// connector's slackAnswers read every 200 whole (io.ReadAll) to check it is Slack's,
// with no bound, so each attempt held all it could read within its time limit (30 s by
// default), at up to the relay's concurrency at once; payment was fixed for the same
// thing with a 1 MiB bound.
func TestDeliver_HugeAnswerIsNotReadWhole(t *testing.T) {
	t.Parallel()
	for _, lookup := range []bool{false, true} {
		name := map[bool]string{false: "Post", true: "Lookup"}[lookup]
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.Copy(io.Discard, r.Body)
				w.Header().Set("Content-Type", "application/json")
				_, _ = io.WriteString(w, `{"ok":true,"channel":"C0TEST","ts":"1700000000.000100","pad":"`)
				chunk := strings.Repeat("a", 64<<10)
				for r.Context().Err() == nil {
					if _, err := io.WriteString(w, chunk); err != nil {
						return
					}
				}
			}))
			t.Cleanup(srv.Close)
			tr := http.DefaultTransport.(*http.Transport).Clone()
			t.Cleanup(tr.CloseIdleConnections)
			ct := &connectortest.CountingTransport{Next: tr, StopAt: 64 << 20}
			c, err := slack.New(slack.Config{Token: "xoxb-test-token", APIBase: srv.URL, HTTPClient: &http.Client{Transport: ct}})
			require.NoError(t, err)

			d := delivery("huge")
			if lookup {
				d.Attempt, d.PreviousAmbiguous = 2, true
			}
			raw, err := c.Deliver(t.Context(), d)
			require.Error(t, err)
			t.Logf("read %d bytes; error: %v", ct.Read(), err)
			require.LessOrEqual(t, ct.Read(), int64(16<<20), "the connector reads an answer of any size whole")
			require.NotContains(t, err.Error(), connectortest.ErrReadPastBound.Error())
			require.Less(t, len(err.Error()), 1000)
			require.Nil(t, raw)
			if !lookup {
				require.True(t, connectors.IsAmbiguous(err), "what answered may have passed the post on: %v", err)
			} else {
				require.False(t, connectors.IsAmbiguous(err), "a lookup posts nothing: %v", err)
			}
		})
	}
}

// A lookup's page that says there are more messages (has_more) but gives no cursor to ask
// for them was taken for the end of the conversation: the retry posted again, though an
// earlier attempt's message may be among those it could not read. It is a lookup that
// did not finish: nothing is posted, and the next attempt looks again.
func TestDeliver_LookupPageWithoutACursorPostsNothing(t *testing.T) {
	t.Parallel()
	var posts atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		if strings.HasSuffix(r.URL.Path, "/chat.postMessage") {
			posts.Add(1)
			_, _ = io.WriteString(w, `{"ok":true,"channel":"C0TEST","ts":"1700000000.000100"}`)
			return
		}
		_, _ = io.WriteString(w, `{"ok":true,"messages":[],"has_more":true,"response_metadata":{"next_cursor":""}}`)
	}))
	t.Cleanup(srv.Close)
	c, err := slack.New(slack.Config{Token: "xoxb-test-token", APIBase: srv.URL + "/"})
	require.NoError(t, err)
	d := delivery("no-cursor")
	d.Attempt, d.PreviousAmbiguous = 2, true
	raw, err := c.Deliver(t.Context(), d)
	require.Error(t, err)
	require.Nil(t, raw)
	require.Zero(t, posts.Load(), "posted without having read the conversation to its end")
	require.False(t, connectors.IsPermanent(err), "looked at again on the next attempt: %v", err)
	require.ErrorContains(t, err, "next_cursor")
}
