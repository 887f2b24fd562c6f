package slack_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/connectors"
	"github.com/outboxd/outboxd/connectors/connectortest"
	"github.com/outboxd/outboxd/connectors/slack"
	"github.com/outboxd/outboxd/internal/slacktest"
)

const testChannel = "C0TEST"

type testBundle struct {
	f *slacktest.Server
	c *slack.Connector
}

// setup starts a fake Slack and a connector for it with cfg; cfg.Token and cfg.APIBase
// default to the fake's, and cfg.HTTPClient to a client on a transport of the test's own.
func setup(t *testing.T, cfg slack.Config) *testBundle {
	t.Helper()
	f := slacktest.Start(t, slacktest.Options{})
	cfg.Token = cmpOr(cfg.Token, slacktest.Token)
	cfg.APIBase = cmpOr(cfg.APIBase, f.APIBase())
	if cfg.HTTPClient == nil {
		cfg.HTTPClient = testClient(t)
	}
	c, err := slack.New(cfg)
	require.NoError(t, err)
	return &testBundle{f: f, c: c}
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

func testClient(t *testing.T) *http.Client {
	t.Helper()
	tr := http.DefaultTransport.(*http.Transport).Clone()
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr}
}

func delivery(key string) connectors.Delivery {
	return connectors.Delivery{
		Key:     key,
		Attempt: 1,
		Payload: json.RawMessage(`{"channel":"` + testChannel + `","text":"order 42 paid"}`),
		Headers: map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},
	}
}

type result struct {
	Channel    string `json:"channel"`
	TS         string `json:"ts"`
	Reconciled bool   `json:"reconciled"`
}

func decodeResult(t *testing.T, raw json.RawMessage) result {
	t.Helper()
	var res result
	require.NoError(t, json.Unmarshal(raw, &res), "result %s", raw)
	return res
}

func TestConstants(t *testing.T) {
	t.Parallel()
	require.Equal(t, slacktest.EventType, slack.EventType)
	require.Equal(t, slacktest.KeyField, slack.KeyField)
}

func TestConformance(t *testing.T) {
	t.Parallel()
	f := slacktest.Start(t, slacktest.Options{})
	c, err := slack.New(slack.Config{Token: slacktest.Token, APIBase: f.APIBase()}) // the shared transport, as in production
	require.NoError(t, err)
	connectortest.Run(t, connectortest.Harness{
		Connector: c,
		PayloadFunc: func(i int) json.RawMessage {
			// A channel per row keeps each history short, as it is for one row's retries.
			return json.RawMessage(fmt.Sprintf(`{"channel":"C%04d","text":"row %d"}`, i, i))
		},
		EffectsFunc:         f.Effects,
		DropAfterEffectFunc: func(key string) { f.Plan(key, slacktest.Plan{DropAfterEffect: true}) },
	})
}

func TestDeliver_Success(t *testing.T) {
	t.Parallel()
	b := setup(t, slack.Config{})

	d := delivery("order-42:notify/slack")
	d.Payload = json.RawMessage(`{
		"channel": "C0TEST",
		"text": "order 42 paid",
		"blocks": [{"type":"section","text":{"type":"mrkdwn","text":"*order 42* paid"}}]
	}`)
	raw, err := b.c.Deliver(t.Context(), d)
	require.NoError(t, err)

	msgs := b.f.Messages(testChannel)
	require.Len(t, msgs, 1)
	require.JSONEq(t, fmt.Sprintf(`{"channel":"C0TEST","ts":%q}`, msgs[0].TS), string(raw))
	require.Equal(t, "order 42 paid", msgs[0].Text)
	require.Equal(t, map[string]any{
		"event_type":    "outboxd_intent",
		"event_payload": map[string]any{"idempotency_key": "order-42:notify/slack"},
	}, msgs[0].Metadata)
	blocks, err := json.Marshal(msgs[0].Blocks)
	require.NoError(t, err)
	require.JSONEq(t, `[{"type":"section","text":{"type":"mrkdwn","text":"*order 42* paid"}}]`, string(blocks))

	form := b.f.LastForm()
	require.Empty(t, form["thread_ts"])
	require.Equal(t, connectors.Reconciled, b.c.Guarantee())
	require.Equal(t, 1, b.f.Posts(d.Key))
	require.Zero(t, b.f.Lookups(testChannel), "a first attempt does not look")
}

func TestDeliver_BlocksOnly(t *testing.T) {
	t.Parallel()
	b := setup(t, slack.Config{})
	d := delivery("k")
	d.Payload = json.RawMessage(`{"channel":"C0TEST","blocks":[{"type":"divider"},{"type":"some_future_block","x":1}]}`)
	_, err := b.c.Deliver(t.Context(), d)
	require.NoError(t, err)
	msgs := b.f.Messages(testChannel)
	require.Len(t, msgs, 1)
	blocks, err := json.Marshal(msgs[0].Blocks)
	require.NoError(t, err)
	require.JSONEq(t, `[{"type":"divider"},{"type":"some_future_block","x":1}]`, string(blocks),
		"a block type slack-go does not know travels unchanged")
}

// The failure that matters most: Slack posts the message, then the connection drops
// before the answer. The attempt is ambiguous; the retry finds the message by its key
// and does not post a second one.
func TestDeliver_DropAfterEffect(t *testing.T) {
	t.Parallel()
	for _, warm := range []bool{false, true} {
		t.Run(fmt.Sprintf("ReusedConnection=%t", warm), func(t *testing.T) {
			t.Parallel()
			b := setup(t, slack.Config{})
			if warm {
				_, err := b.c.Deliver(t.Context(), delivery("warm-up"))
				require.NoError(t, err)
			}
			b.f.Plan("k", slacktest.Plan{DropAfterEffect: true})

			raw, err := b.c.Deliver(t.Context(), delivery("k"))
			require.Error(t, err)
			require.Nil(t, raw)
			require.True(t, connectors.IsAmbiguous(err), "%v", err)
			require.False(t, connectors.IsPermanent(err))
			require.Contains(t, err.Error(), "chat.postMessage C0TEST: no answer after the request was sent")
			require.NotContains(t, err.Error(), slacktest.Token)
			require.Equal(t, 1, b.f.Posts("k"), "the transport did not resend on its own")
			require.Equal(t, 1, b.f.Effects("k"))

			d := delivery("k")
			d.Attempt, d.PreviousAmbiguous = 2, true
			raw, err = b.c.Deliver(t.Context(), d)
			require.NoError(t, err)
			res := decodeResult(t, raw)
			msgs := b.f.Messages(testChannel)
			require.Equal(t, result{Channel: testChannel, TS: msgs[len(msgs)-1].TS, Reconciled: true}, res)
			require.Equal(t, 1, b.f.Effects("k"), "exactly one message carries the key")
			require.Equal(t, 1, b.f.Posts("k"), "the retry did not post")
			require.Equal(t, 1, b.f.Lookups(testChannel))
		})
	}
}

// A retry whose earlier attempt never reached Slack looks, finds nothing, and posts.
func TestDeliver_RetryNotFoundPosts(t *testing.T) {
	t.Parallel()
	b := setup(t, slack.Config{})
	b.f.Seed(testChannel, "someone else's message")
	b.f.Plan("k", slacktest.Plan{Status: http.StatusServiceUnavailable})

	_, err := b.c.Deliver(t.Context(), delivery("k"))
	require.Error(t, err)
	require.False(t, connectors.IsPermanent(err))
	require.Zero(t, b.f.Effects("k"))

	d := delivery("k")
	d.Attempt = 2
	raw, err := b.c.Deliver(t.Context(), d)
	require.NoError(t, err)
	require.False(t, decodeResult(t, raw).Reconciled)
	require.Equal(t, 1, b.f.Effects("k"))
	require.Equal(t, 1, b.f.Lookups(testChannel))
}

// A conversation with no messages since the first attempt is answered with an empty
// list ("messages": []): the retry reads it as one without the key, and posts.
func TestDeliver_RetryInEmptyConversationPosts(t *testing.T) {
	t.Parallel()
	b := setup(t, slack.Config{})
	d := delivery("k")
	d.Attempt = 2
	raw, err := b.c.Deliver(t.Context(), d)
	require.NoError(t, err)
	require.False(t, decodeResult(t, raw).Reconciled)
	require.Equal(t, 1, b.f.Effects("k"))
}

// A thread reply is not in the channel's history; the retry reads the thread, page by
// page.
func TestDeliver_ThreadReply(t *testing.T) {
	t.Parallel()
	b := setup(t, slack.Config{HistoryLimit: 2})
	threadTS, reply := startThread(t, b)
	for i := range 4 { // the thread outgrows a page of 2
		_, err := b.c.Deliver(t.Context(), reply(fmt.Sprintf("earlier-%d", i)))
		require.NoError(t, err)
	}
	require.Equal(t, threadTS, b.f.LastForm()["thread_ts"][0])

	b.f.Plan("k", slacktest.Plan{DropAfterEffect: true})
	_, err := b.c.Deliver(t.Context(), reply("k"))
	require.True(t, connectors.IsAmbiguous(err), "%v", err)

	d := reply("k")
	retryReconciles(t, b, d)
	require.Equal(t, 3, b.f.Lookups(testChannel), "6 messages in the thread, 2 per page")
}

// The lookup reads only the messages since a little before the row's first attempt, so
// a busy conversation's older messages neither hide an earlier attempt's message nor make
// the lookup inconclusive; read to the end without the key, it posts.
func TestDeliver_HistoryLimit(t *testing.T) {
	t.Parallel()
	b := setup(t, slack.Config{HistoryLimit: 1})
	for i := range 15 { // more than the 10 pages of 1 a lookup reads, all from before
		b.f.SeedAt(testChannel, fmt.Sprintf("old chatter %d", i), time.Now().Add(-time.Hour))
	}
	first := time.Now()
	b.f.Plan("k", slacktest.Plan{DropAfterEffect: true})
	d := delivery("k")
	d.FirstAttemptAt = first
	_, err := b.c.Deliver(t.Context(), d)
	require.True(t, connectors.IsAmbiguous(err), "%v", err)
	for i := range 5 {
		b.f.Seed(testChannel, fmt.Sprintf("chatter %d", i))
	}
	retryReconciles(t, b, d)

	// An earlier attempt that was refused posted nothing: the lookup reads to the end of
	// the messages since the first attempt, and the retry posts.
	b.f.Plan("n", slacktest.Plan{Status: http.StatusServiceUnavailable})
	d = delivery("n")
	d.FirstAttemptAt = time.Now()
	_, err = b.c.Deliver(t.Context(), d)
	require.Error(t, err)
	require.Zero(t, b.f.Effects("n"))
	d.Attempt = 2
	raw, err := b.c.Deliver(t.Context(), d)
	require.NoError(t, err)
	require.False(t, decodeResult(t, raw).Reconciled, "%s", raw)
	require.Equal(t, 1, b.f.Effects("n"))
}

func TestDeliver_HangAfterEffect(t *testing.T) {
	t.Parallel()
	// The timeout ends the hang; it is long enough for a slow machine to post (and, in
	// the second attempt, look through the history) well within it.
	b := setup(t, slack.Config{Timeout: time.Second})
	b.f.Plan("k", slacktest.Plan{HangAfterEffect: true})

	_, err := b.c.Deliver(t.Context(), delivery("k"))
	require.Error(t, err)
	require.True(t, connectors.IsAmbiguous(err), "%v", err)
	require.ErrorIs(t, err, slack.ErrTimeout)

	d := delivery("k")
	retryReconciles(t, b, d)
}

func TestDeliver_RateLimited(t *testing.T) {
	t.Parallel()
	b := setup(t, slack.Config{})
	b.f.Plan("k", slacktest.Plan{Status: http.StatusTooManyRequests, RetryAfter: "7"})

	raw, err := b.c.Deliver(t.Context(), delivery("k"))
	require.Error(t, err)
	require.Nil(t, raw)
	require.False(t, connectors.IsPermanent(err))
	require.False(t, connectors.IsAmbiguous(err), "Slack refused the post")
	delay, ok := connectors.RetryDelay(err)
	require.True(t, ok, "%v", err)
	require.Equal(t, 7*time.Second, delay)
	require.Zero(t, b.f.Effects("k"))
}

func TestDeliver_SlackErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		code      string
		permanent bool
		ambiguous bool
	}{
		{"channel_not_found", true, false},
		{"not_in_channel", true, false},
		{"invalid_auth", true, false},
		{"account_inactive", true, false},
		{"token_revoked", true, false},
		{"is_archived", true, false},
		{"msg_too_long", true, false},
		{"invalid_blocks", true, false},
		{"missing_scope", true, false},
		{"some_new_error", true, false},
		{"service_unavailable", false, false},
		{"ratelimited", false, false},
		// A workspace moving into an Enterprise organization: Slack says the API is
		// unavailable until the migration completes, not that the request is wrong.
		{"team_added_to_org", false, false},
		{"org_login_required", false, false},
		// A free workspace's usage limit on messages in a short period: Slack refused the
		// post, and a later attempt is let through (as when it comes as a 429).
		{"message_limit_exceeded", false, false},
		{"internal_error", false, true},
		{"fatal_error", false, true},
	}
	for _, tt := range tests {
		t.Run(tt.code, func(t *testing.T) {
			t.Parallel()
			b := setup(t, slack.Config{})
			b.f.Plan("k", slacktest.Plan{Error: tt.code})
			_, err := b.c.Deliver(t.Context(), delivery("k"))
			require.Error(t, err)
			require.Contains(t, err.Error(), "chat.postMessage C0TEST: "+tt.code)
			require.Equal(t, tt.permanent, connectors.IsPermanent(err), "%v", err)
			require.Equal(t, tt.ambiguous, connectors.IsAmbiguous(err), "%v", err)
		})
	}
}

// The fake answers a channel name the way Slack's history does, but the connector
// refuses it before asking: it could not reconcile a retry.
func TestDeliver_ChannelNotFound(t *testing.T) {
	t.Parallel()
	b := setup(t, slack.Config{})
	b.f.Plan("k", slacktest.Plan{Error: "channel_not_found"})
	_, err := b.c.Deliver(t.Context(), delivery("k"))
	require.True(t, connectors.IsPermanent(err), "%v", err)
	require.Zero(t, b.f.Effects("k"))
}

func TestDeliver_InvalidAuth(t *testing.T) {
	t.Parallel()
	b := setup(t, slack.Config{Token: "xoxb-wrong-token"})
	_, err := b.c.Deliver(t.Context(), delivery("k"))
	require.Error(t, err)
	require.True(t, connectors.IsPermanent(err), "%v", err)
	require.Contains(t, err.Error(), "invalid_auth")
	require.NotContains(t, err.Error(), "wrong-token")
	require.Zero(t, b.f.Effects("k"))
}

func TestDeliver_HTTPStatus(t *testing.T) {
	t.Parallel()
	tests := []struct {
		status    int
		permanent bool
	}{
		{http.StatusInternalServerError, false},
		{http.StatusBadGateway, false},
		{http.StatusServiceUnavailable, false},
		{http.StatusTooManyRequests, false}, // without Retry-After
		{http.StatusRequestTimeout, false},
		{http.StatusNotFound, true},
		{http.StatusForbidden, true},
		{http.StatusFound, true},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprint(tt.status), func(t *testing.T) {
			t.Parallel()
			b := setup(t, slack.Config{})
			b.f.Plan("k", slacktest.Plan{Status: tt.status})
			_, err := b.c.Deliver(t.Context(), delivery("k"))
			require.Error(t, err)
			require.Equal(t, tt.permanent, connectors.IsPermanent(err), "%v", err)
			// A gateway's 502 may follow a post Slack made (TestDeliver_GatewayAnswerToAPostIsAmbiguous).
			require.Equal(t, tt.status == http.StatusBadGateway, connectors.IsAmbiguous(err), "%v", err)
			_, hasDelay := connectors.RetryDelay(err)
			require.False(t, hasDelay)
		})
	}
}

func TestDeliver_LookupFails(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		plan      slacktest.Plan
		permanent bool
		delay     time.Duration
	}{
		{"ServerError", slacktest.Plan{Status: http.StatusInternalServerError}, false, 0},
		{"RateLimited", slacktest.Plan{Status: http.StatusTooManyRequests, RetryAfter: "3"}, false, 3 * time.Second},
		{"MissingScope", slacktest.Plan{Error: "missing_scope"}, true, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, slack.Config{})
			b.f.PlanLookup(tt.plan)
			d := delivery("k")
			d.Attempt, d.PreviousAmbiguous = 2, true
			_, err := b.c.Deliver(t.Context(), d)
			require.Error(t, err)
			require.Contains(t, err.Error(), "look up the key in conversations.history C0TEST")
			require.Equal(t, tt.permanent, connectors.IsPermanent(err), "%v", err)
			require.False(t, connectors.IsAmbiguous(err), "a lookup acts on nothing: %v", err)
			delay, _ := connectors.RetryDelay(err)
			require.Equal(t, tt.delay, delay)
			require.Zero(t, b.f.Posts("k"), "no post without a successful lookup")
		})
	}
}

func TestDeliver_APIBase(t *testing.T) {
	t.Parallel()
	for _, trim := range []bool{false, true} {
		t.Run(fmt.Sprintf("TrailingSlash=%t", !trim), func(t *testing.T) {
			t.Parallel()
			f := slacktest.Start(t, slacktest.Options{})
			base := f.APIBase()
			if trim {
				base = strings.TrimSuffix(base, "/")
			}
			c, err := slack.New(slack.Config{Token: slacktest.Token, APIBase: base, HTTPClient: testClient(t)})
			require.NoError(t, err)
			require.Equal(t, "slack "+f.APIBase(), c.String())
			_, err = c.Deliver(t.Context(), delivery("k"))
			require.NoError(t, err)
			d := delivery("k")
			d.Attempt = 2
			raw, err := c.Deliver(t.Context(), d)
			require.NoError(t, err)
			require.True(t, decodeResult(t, raw).Reconciled)
			require.Equal(t, 1, f.Effects("k"))
		})
	}
}

func TestDeliver_InvalidPayload(t *testing.T) {
	t.Parallel()
	b := setup(t, slack.Config{})
	tests := map[string]string{
		"NotJSON":         `{`,
		"NoChannel":       `{"text":"x"}`,
		"ChannelName":     `{"channel":"#general","text":"x"}`,
		"UserID":          `{"channel":"U123ABC","text":"x"}`,
		"NoText":          `{"channel":"C0TEST"}`,
		"EmptyBlocks":     `{"channel":"C0TEST","blocks":[]}`,
		"BlocksNotArray":  `{"channel":"C0TEST","blocks":{"type":"divider"}}`,
		"UnknownField":    `{"channel":"C0TEST","text":"x","icon_emoji":":tada:"}`,
		"TrailingData":    `{"channel":"C0TEST","text":"x"} {}`,
		"BadBlock":        `{"channel":"C0TEST","blocks":[{"type":"section","text":7}]}`,
		"WrongTextType":   `{"channel":"C0TEST","text":7}`,
		"NotAnObject":     `[1,2]`,
		"EmptyChannelStr": `{"channel":"","text":"x"}`,
	}
	for name, payload := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			require.Error(t, slack.ValidatePayload(json.RawMessage(payload)))
			d := delivery("invalid-" + name)
			d.Payload = json.RawMessage(payload)
			_, err := b.c.Deliver(t.Context(), d)
			require.True(t, connectors.IsPermanent(err), "%v", err)
			require.Zero(t, b.f.Posts(d.Key))
		})
	}

	t.Run("NoKey", func(t *testing.T) {
		t.Parallel()
		d := delivery("")
		_, err := b.c.Deliver(t.Context(), d)
		require.True(t, connectors.IsPermanent(err), "%v", err)
	})
}

func TestDeliver_CancelledBeforeLookup(t *testing.T) {
	t.Parallel()
	b := setup(t, slack.Config{})
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	d := delivery("k")
	d.Attempt = 3
	_, err := b.c.Deliver(ctx, d)
	require.Error(t, err)
	require.False(t, connectors.IsPermanent(err))
	require.False(t, connectors.IsAmbiguous(err))
	require.Zero(t, b.f.Posts("k"))
}

func TestNew_Validation(t *testing.T) {
	t.Parallel()
	_, err := slack.New(slack.Config{})
	require.EqualError(t, err, "slack config: Token: required")

	_, err = slack.New(slack.Config{
		Token:        "xoxb-abc def",
		APIBase:      "ftp://user:pw@example.com/api",
		Timeout:      -time.Second,
		HistoryLimit: 1000,
	})
	require.Error(t, err)
	lines := strings.Split(err.Error(), "\n")
	require.Equal(t, []string{
		"slack config: Token: contains whitespace",
		`slack config: APIBase: scheme must be http or https, not "ftp"`,
		"slack config: Timeout: -1s is negative",
		"slack config: HistoryLimit: 1000 is not between 1 and 999",
	}, lines)
	require.NotContains(t, err.Error(), "abc")

	for _, base := range []string{"http://", "https://x:y@slack.com/api", "https://slack.com/api?x=1", "::"} {
		_, err := slack.New(slack.Config{Token: slacktest.Token, APIBase: base})
		require.Error(t, err, base)
		require.Contains(t, err.Error(), "APIBase: ")
	}

	c, err := slack.New(slack.Config{Token: slacktest.Token})
	require.NoError(t, err)
	require.Equal(t, "slack https://slack.com/api/", c.String())
}

func TestSecretsStayOut(t *testing.T) {
	t.Parallel()
	cfg := slack.Config{Token: slacktest.Token}
	c, err := slack.New(cfg)
	require.NoError(t, err)

	var buf bytes.Buffer
	log := slog.New(slog.NewJSONHandler(&buf, nil))
	log.Info("configured", "cfg", cfg, "connector", c)
	for _, s := range []string{
		buf.String(),
		fmt.Sprintf("%v %+v %#v %s", cfg, cfg, cfg, cfg),
		fmt.Sprintf("%v %+v %#v %s", c, c, c, c),
	} {
		require.NotContains(t, s, "secretpart")
		require.NotContains(t, s, "1234-5678")
	}
	require.Contains(t, buf.String(), "xoxb-REDACTED")
}

// startThread posts a parent message and returns its ts and a function that makes the
// delivery of a reply in its thread under key.
func startThread(t *testing.T, b *testBundle) (threadTS string, reply func(key string) connectors.Delivery) {
	t.Helper()
	parent, err := b.c.Deliver(t.Context(), delivery("parent"))
	require.NoError(t, err)
	threadTS = decodeResult(t, parent).TS
	return threadTS, func(key string) connectors.Delivery {
		d := delivery(key)
		d.Payload = json.RawMessage(fmt.Sprintf(`{"channel":"C0TEST","text":"reply","thread_ts":%q}`, threadTS))
		return d
	}
}

// A 429 whose Retry-After is an HTTP date (RFC 9110 allows it, and a proxy in front of
// the API may send one) is a refusal to wait out, not a post that got no answer.
func TestDeliver_RateLimitedRetryAfterDate(t *testing.T) {
	t.Parallel()
	for _, lookup := range []bool{false, true} {
		t.Run(fmt.Sprintf("Lookup=%t", lookup), func(t *testing.T) {
			t.Parallel()
			b := setup(t, slack.Config{})
			plan := slacktest.Plan{Status: http.StatusTooManyRequests, RetryAfter: time.Now().Add(time.Hour).UTC().Format(http.TimeFormat)}
			d := delivery("k")
			if lookup {
				b.f.PlanLookup(plan)
				d.Attempt = 2
			} else {
				b.f.Plan("k", plan)
			}
			_, err := b.c.Deliver(t.Context(), d)
			require.Error(t, err)
			require.False(t, connectors.IsPermanent(err), "%v", err)
			require.False(t, connectors.IsAmbiguous(err), "Slack refused the request: %v", err)
			require.NotContains(t, err.Error(), "no answer")
			delay, ok := connectors.RetryDelay(err)
			require.True(t, ok, "%v", err)
			require.InDelta(t, time.Hour.Seconds(), delay.Seconds(), 5)
			require.Zero(t, b.f.Effects("k"))
		})
	}

	// A Retry-After that is neither seconds nor a date is ignored: the 429 is retried with
	// backoff.
	b := setup(t, slack.Config{})
	b.f.Plan("k", slacktest.Plan{Status: http.StatusTooManyRequests, RetryAfter: "soon"})
	_, err := b.c.Deliver(t.Context(), delivery("k"))
	require.Error(t, err)
	require.False(t, connectors.IsPermanent(err), "%v", err)
	require.False(t, connectors.IsAmbiguous(err), "Slack refused the post: %v", err)
	_, ok := connectors.RetryDelay(err)
	require.False(t, ok, "%v", err)
}

// Slack takes at most 50 blocks a message and answers invalid_blocks to more, on every
// attempt: such a payload is refused before the row is written, and never posted.
func TestValidatePayload_AtMost50Blocks(t *testing.T) {
	t.Parallel()
	blocks := func(n int) json.RawMessage {
		return json.RawMessage(`{"channel":"C0TEST","text":"x","blocks":[` +
			strings.TrimSuffix(strings.Repeat(`{"type":"divider"},`, n), ",") + `]}`)
	}
	require.NoError(t, slack.ValidatePayload(blocks(50)))
	err := slack.ValidatePayload(blocks(51))
	require.ErrorContains(t, err, "51 blocks")

	b := setup(t, slack.Config{})
	d := delivery("too-many-blocks")
	d.Payload = blocks(51)
	_, err = b.c.Deliver(t.Context(), d)
	require.True(t, connectors.IsPermanent(err), "%v", err)
	require.Zero(t, b.f.Posts(d.Key))
}
