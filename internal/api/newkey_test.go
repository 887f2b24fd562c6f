package api_test

import (
	"encoding/json"
	"net/http"
	"net/url"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/internal/ops"
	"github.com/outboxd/outboxd/outbox"
)

// After outboxd replay --new-key, the operation of a dead intent continues under a new
// key, and the intent itself stays dead. GET of its key must say where the operation
// went, the copy's key and status, or a client takes the dead intent for a failed
// operation and acts again (or reports a failure for an effect that happened); and the
// copy's answer names the key it copies. Tokens see only what their connectors allow.
// The list and the same request POSTed again answer the intent too, and name the same
// (agree): they named neither, so a client that listed its dead intents, or asked again
// the way the key is for, read the operation as failed.
func TestReadsNameTheCopyAReplayWithANewKeyMade(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	ctx := t.Context()
	r := b.do(t, "POST", "/v1/intents", agentSecret, "order-9/notify", `{"connector":"webhook:crm","payload":{"order":9}}`)
	require.Equal(t, http.StatusCreated, r.status, r.raw)
	_, err := b.pool.Exec(ctx, `UPDATE outbox SET status = 'dead', attempts = 5, last_error = 'receiver answered 500'
		WHERE idempotency_key = 'order-9/notify'`)
	require.NoError(t, err)
	newKey := func() string {
		t.Helper()
		res, err := ops.Replay(ctx, b.pool, ops.Selection{Keys: []string{"order-9/notify"}},
			ops.ReplayOptions{Actor: "op", NewKey: true})
		require.NoError(t, err)
		require.Equal(t, []string{"order-9/notify"}, res.Replayed, "%+v", res)
		return res.NewKeys["order-9/notify"]
	}
	// again is whether a row's request may be POSTed again: not once plain SQL changed
	// its connector, which the outbox then takes for another request under the key.
	again := true
	get := func(secret, key string) response {
		t.Helper()
		r := b.do(t, "GET", "/v1/intents/"+url.PathEscape(key), secret, "", "")
		agree(t, b, secret, r, again)
		return r
	}
	first := newKey()

	r = get(agentSecret, "order-9/notify")
	require.Equal(t, http.StatusOK, r.status, r.raw)
	require.Equal(t, "dead", r.body["status"])
	require.Equal(t, map[string]any{"key": first, "status": "pending"}, r.body["replayed_as"], r.raw)
	require.NotContains(t, r.body, "copy_of")

	r = get(crmSecret, first) // a copy keeps its row's connector: crm sees both
	require.Equal(t, http.StatusOK, r.status, r.raw)
	require.Equal(t, "order-9/notify", r.body["copy_of"], r.raw)
	require.NotContains(t, r.body, "replayed_as")

	// The copy died too, and an operator made a second one: the first copy and the row
	// both name the second, where the operation is now.
	_, err = b.pool.Exec(ctx, `UPDATE outbox SET status = 'dead' WHERE idempotency_key = $1`, first)
	require.NoError(t, err)
	second := newKey()
	_, err = b.pool.Exec(ctx, `UPDATE outbox SET status = 'delivered', delivered_at = now() WHERE idempotency_key = $1`, second)
	require.NoError(t, err)
	for _, key := range []string{"order-9/notify", first} {
		r = get(crmSecret, key)
		require.Equal(t, http.StatusOK, r.status, r.raw)
		require.Equal(t, "dead", r.body["status"])
		require.Equal(t, map[string]any{"key": second, "status": "delivered"}, r.body["replayed_as"], r.raw)
	}

	// Deleted after OUTBOX_RETENTION, the copy is gone, and the row still names it.
	_, err = b.pool.Exec(ctx, `DELETE FROM outbox WHERE idempotency_key = $1`, second)
	require.NoError(t, err)
	r = get(crmSecret, "order-9/notify")
	require.Equal(t, http.StatusOK, r.status, r.raw)
	require.Equal(t, map[string]any{"key": second, "gone": true}, r.body["replayed_as"], r.raw)

	// A token that may not read a copy (its connector changed by plain SQL) is not told
	// it exists; nor the key of the row a copy copies.
	_, err = outbox.Enqueue(ctx, b.pool, outbox.Message{Key: "other", Connector: "webhook", Payload: map[string]any{}})
	require.NoError(t, err)
	_, err = b.pool.Exec(ctx, `UPDATE outbox SET status = 'dead' WHERE idempotency_key = 'other'`)
	require.NoError(t, err)
	res, err := ops.Replay(ctx, b.pool, ops.Selection{Keys: []string{"other"}}, ops.ReplayOptions{Actor: "op", NewKey: true})
	require.NoError(t, err)
	otherCopy := res.NewKeys["other"]
	require.NotEmpty(t, otherCopy, "%+v", res)
	_, err = b.pool.Exec(ctx, `UPDATE outbox SET connector = 'email' WHERE idempotency_key = $1`, otherCopy)
	require.NoError(t, err)
	again = false
	r = get(agentSecret, "other")
	require.Equal(t, http.StatusOK, r.status, r.raw)
	require.NotContains(t, r.body, "replayed_as", r.raw)
	require.NotContains(t, r.raw, otherCopy)
	_, err = b.pool.Exec(ctx, `UPDATE outbox SET connector = 'webhook:crm' WHERE idempotency_key = $1`, otherCopy)
	require.NoError(t, err)
	r = get(crmSecret, otherCopy)
	require.Equal(t, http.StatusOK, r.status, r.raw)
	require.NotContains(t, r.body, "copy_of", r.raw)
	require.NotContains(t, r.raw, `"other"`)
	r = get(agentSecret, otherCopy)
	require.Equal(t, http.StatusOK, r.status, r.raw)
	require.Equal(t, "other", r.body["copy_of"], r.raw)
}

// agree requires the other answers of the intent in got, GET /v1/intents/{key}'s answer
// as secret, to say what became of its operation as got does (its copies, whether a
// canceled one may have acted: answerFields): its entry in the list, and, when again is
// set, the answer to its request POSTed again under its key.
func agree(t *testing.T, b *testBundle, secret string, got response, again bool) {
	t.Helper()
	if got.status != http.StatusOK {
		return
	}
	key := got.body["key"].(string)
	list := b.do(t, "GET", "/v1/intents?limit=1000", secret, "", "")
	require.Equal(t, http.StatusOK, list.status, list.raw)
	var listed map[string]any
	for _, in := range list.body["intents"].([]any) {
		if in.(map[string]any)["key"] == key {
			listed = in.(map[string]any)
		}
	}
	require.NotNil(t, listed, "%s is not listed: %s", key, list.raw)
	for _, field := range answerFields {
		require.Equal(t, got.body[field], listed[field], "%s of %s listed: %s", field, key, list.raw)
	}
	if !again {
		return
	}
	body, err := json.Marshal(map[string]any{"connector": got.body["connector"], "payload": got.body["payload"]})
	require.NoError(t, err)
	posted := b.do(t, "POST", "/v1/intents", secret, key, string(body))
	require.Equal(t, http.StatusOK, posted.status, posted.raw)
	require.Equal(t, "true", posted.header.Get("Idempotent-Replayed"))
	for _, field := range answerFields {
		require.Equal(t, got.body[field], posted.body[field], "%s of %s posted again: %s", field, key, posted.raw)
	}
}

// answerFields are the fields of an intent's answer beyond the intent's own.
var answerFields = []string{"copy_of", "replayed_as", "may_have_acted"}

// An operator may re-execute a held intent under a new key (replay --new-key leaves the
// row held) and an admin cancel the held row after: the operation goes on under the
// copy. The cancel answered "canceled" alone, which reads as an operation stopped, where
// GET names the copy; it answers the intent as GET does.
func TestCancelAnswerNamesTheCopy(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	ctx := t.Context()
	r := b.do(t, "POST", "/v1/intents", agentSecret, "order-7/notify", `{"connector":"webhook","payload":{"order":7}}`)
	require.Equal(t, http.StatusCreated, r.status, r.raw)
	_, err := b.pool.Exec(ctx, `UPDATE outbox SET status = 'held', attempts = 1, ambiguous = true WHERE idempotency_key = 'order-7/notify'`)
	require.NoError(t, err)
	res, err := ops.Replay(ctx, b.pool, ops.Selection{Keys: []string{"order-7/notify"}}, ops.ReplayOptions{Actor: "op", NewKey: true})
	require.NoError(t, err)
	cp := res.NewKeys["order-7/notify"]
	require.NotEmpty(t, cp, "%+v", res)

	r = b.do(t, "POST", "/v1/intents/order-7%2Fnotify/cancel", adminSecret, "", `{"reason":"duplicate"}`)
	require.Equal(t, http.StatusOK, r.status, r.raw)
	require.Equal(t, "canceled", r.body["status"], r.raw)
	require.Equal(t, map[string]any{"key": cp, "status": "pending"}, r.body["replayed_as"], r.raw)
	require.Contains(t, r.body, "may_have_acted", r.raw)
	got := b.do(t, "GET", "/v1/intents/order-7%2Fnotify", adminSecret, "", "")
	require.Equal(t, got.body["replayed_as"], r.body["replayed_as"], got.raw)
}
