package webhook_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/connectors"
	"github.com/outboxd/outboxd/connectors/connectortest"
	"github.com/outboxd/outboxd/connectors/webhook"
	"github.com/outboxd/outboxd/internal/receiver"
)

// testSecret is the Standard Webhooks specification's example secret.
const testSecret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"

const traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

type testBundle struct {
	r *receiver.Receiver
	c *webhook.Connector
}

// setup starts a receiver with opts and a connector for it with cfg; cfg.URL defaults to
// the receiver's, and cfg.Client to a client on a transport of the test's own.
func setup(t *testing.T, opts receiver.Options, cfg webhook.Config) *testBundle {
	t.Helper()
	r, err := receiver.Start(opts)
	require.NoError(t, err)
	t.Cleanup(r.Close)
	if cfg.URL == "" {
		cfg.URL = r.URL()
	}
	if cfg.Client == nil {
		cfg.Client = testClient(t)
	}
	c, err := webhook.New(cfg)
	require.NoError(t, err)
	return &testBundle{r: r, c: c}
}

func testClient(t *testing.T) *http.Client {
	t.Helper()
	tr := webhook.DefaultTransport().Clone()
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr}
}

func delivery(key string) connectors.Delivery {
	return connectors.Delivery{
		Key:     key,
		Attempt: 1,
		Payload: json.RawMessage(`{ "order": 42,  "state": "paid" }`),
		Headers: map[string]string{"traceparent": traceparent},
	}
}

type result struct {
	Status    int    `json:"status"`
	Body      string `json:"body"`
	Truncated bool   `json:"truncated"`
}

func decodeResult(t *testing.T, raw json.RawMessage) result {
	t.Helper()
	var res result
	require.NoError(t, json.Unmarshal(raw, &res), "result %s", raw)
	return res
}

func TestConformance(t *testing.T) {
	t.Parallel()

	payload := func(i int) json.RawMessage { return json.RawMessage(fmt.Sprintf(`{"row":%d}`, i)) }
	harness := func(t *testing.T, r *receiver.Receiver, g connectors.Guarantee) connectortest.Harness {
		t.Helper()
		c, err := webhook.New(webhook.Config{URL: r.URL(), Guarantee: g}) // the shared transport, as in production
		require.NoError(t, err)
		return connectortest.Harness{
			Connector:           c,
			PayloadFunc:         payload,
			EffectsFunc:         r.Effects,
			RequestsFunc:        r.Requests,
			DropAfterEffectFunc: func(key string) { r.Plan(key, receiver.Plan{DropAfterEffect: 1}) },
		}
	}

	t.Run("Enforced", func(t *testing.T) {
		t.Parallel()
		r, err := receiver.Start(receiver.Options{})
		require.NoError(t, err)
		t.Cleanup(r.Close)
		connectortest.Run(t, harness(t, r, connectors.Enforced))
	})

	// A receiver that ignores the key is what "forwarded" warns about.
	t.Run("Forwarded", func(t *testing.T) {
		t.Parallel()
		r, err := receiver.Start(receiver.Options{IgnoreKeys: true})
		require.NoError(t, err)
		t.Cleanup(r.Close)
		connectortest.Run(t, harness(t, r, connectors.Forwarded))
	})
}

func TestDeliver_Success(t *testing.T) {
	t.Parallel()
	b := setup(t, receiver.Options{}, webhook.Config{})

	d := delivery("order-42:notify/crm")
	d.Headers["Idempotency-Key"] = "a row can't change the key"
	d.Headers["X-Tenant"] = "acme"
	raw, err := b.c.Deliver(t.Context(), d)
	require.NoError(t, err)

	res := decodeResult(t, raw)
	require.Equal(t, http.StatusOK, res.Status)
	require.JSONEq(t, `{"received":"order-42:notify/crm","effect":1}`, res.Body)
	require.False(t, res.Truncated)
	require.NotContains(t, string(raw), "truncated")

	log := b.r.EffectLog()
	require.Len(t, log, 1)
	e := log[0]
	require.Equal(t, "order-42:notify/crm", e.Key)
	require.Equal(t, string(d.Payload), string(e.Body), "the payload travels verbatim")
	require.Equal(t, "application/json", e.Headers.Get("Content-Type"))
	require.Equal(t, "outboxd", e.Headers.Get("User-Agent"))
	require.Equal(t, traceparent, e.Headers.Get("Traceparent"))
	require.Equal(t, "acme", e.Headers.Get("X-Tenant"))
	require.Empty(t, e.Headers.Get("Webhook-Signature"), "no secret, no signature")

	require.Equal(t, connectors.Forwarded, b.c.Guarantee(), "the default guarantee")
}

func TestDeliver_SameKeyTwice(t *testing.T) {
	t.Parallel()
	b := setup(t, receiver.Options{}, webhook.Config{Guarantee: connectors.Enforced})

	first, err := b.c.Deliver(t.Context(), delivery("k"))
	require.NoError(t, err)
	d := delivery("k")
	d.Attempt = 2
	second, err := b.c.Deliver(t.Context(), d)
	require.NoError(t, err)

	require.JSONEq(t, string(first), string(second), "the stored answer comes back")
	require.Equal(t, 1, b.r.Effects("k"))
	require.Equal(t, 2, b.r.Requests("k"))
	require.Equal(t, connectors.Enforced, b.c.Guarantee())
}

// The failure that matters most: the receiver acts, then the connection drops before the
// answer. The attempt is ambiguous; the retry with the same key finds the stored answer.
func TestDeliver_DropAfterEffect(t *testing.T) {
	t.Parallel()

	for _, warm := range []bool{false, true} {
		t.Run(fmt.Sprintf("ReusedConnection=%t", warm), func(t *testing.T) {
			t.Parallel()
			b := setup(t, receiver.Options{}, webhook.Config{Guarantee: connectors.Enforced})
			if warm {
				// On a reused connection net/http would resend the request by itself,
				// and the ambiguous attempt would never be seen.
				_, err := b.c.Deliver(t.Context(), delivery("warm-up"))
				require.NoError(t, err)
			}
			b.r.Plan("k", receiver.Plan{DropAfterEffect: 1})

			raw, err := b.c.Deliver(t.Context(), delivery("k"))
			require.Error(t, err)
			require.Nil(t, raw)
			require.True(t, connectors.IsAmbiguous(err), "%v", err)
			require.False(t, connectors.IsPermanent(err))
			require.Contains(t, err.Error(), "POST "+connectors.RedactEndpoint(b.r.URL())+": no readable answer after the request was sent; the receiver may have acted")
			require.Equal(t, 1, b.r.Requests("k"), "the transport did not resend on its own")
			require.Equal(t, 1, b.r.Effects("k"))

			d := delivery("k")
			d.Attempt, d.PreviousAmbiguous = 2, true
			raw, err = b.c.Deliver(t.Context(), d)
			require.NoError(t, err)
			require.JSONEq(t, `{"received":"k","effect":1}`, decodeResult(t, raw).Body)
			require.Equal(t, 1, b.r.Effects("k"))
		})
	}
}

func TestDeliver_Retryable(t *testing.T) {
	t.Parallel()
	now := time.Date(2030, 5, 6, 7, 8, 9, 0, time.UTC)
	b := setup(t, receiver.Options{}, webhook.Config{NowFunc: func() time.Time { return now }})

	tests := []struct {
		name       string
		plan       receiver.Plan
		wantStatus int
		wantDelay  time.Duration // 0: no Retry-After
	}{
		{"503Seconds", receiver.Plan{FailFirst: 1, RetryAfter: "7"}, 503, 7 * time.Second},
		{"503Date", receiver.Plan{FailFirst: 1, RetryAfter: now.Add(90 * time.Second).Format(http.TimeFormat), Date: now.Format(http.TimeFormat)}, 503, 90 * time.Second},
		{"429PastDate", receiver.Plan{FailFirst: 1, FailStatus: 429, RetryAfter: now.Add(-time.Hour).Format(http.TimeFormat), Date: now.Format(http.TimeFormat)}, 429, -1},
		{"429Garbage", receiver.Plan{FailFirst: 1, FailStatus: 429, RetryAfter: "soon"}, 429, 0},
		{"408", receiver.Plan{FailFirst: 1, FailStatus: 408}, 408, 0},
		{"409", receiver.Plan{FailFirst: 1, FailStatus: 409}, 409, 0},
		{"425", receiver.Plan{FailFirst: 1, FailStatus: 425}, 425, 0},
		{"500", receiver.Plan{FailFirst: 1, FailStatus: 500}, 500, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			key := "retryable-" + tt.name
			b.r.Plan(key, tt.plan)

			raw, err := b.c.Deliver(t.Context(), delivery(key))
			require.Error(t, err)
			require.False(t, connectors.IsPermanent(err), "%v", err)
			require.False(t, connectors.IsAmbiguous(err), "an answer is not ambiguous")
			require.Contains(t, err.Error(), fmt.Sprintf("POST %s: receiver answered %d %s: ", connectors.RedactEndpoint(b.r.URL()), tt.wantStatus, http.StatusText(tt.wantStatus)))
			require.Contains(t, err.Error(), "planned failure", "the body excerpt is in the error")

			res := decodeResult(t, raw)
			require.Equal(t, tt.wantStatus, res.Status)
			require.Contains(t, res.Body, "planned failure")

			delay, ok := connectors.RetryDelay(err)
			switch {
			case tt.wantDelay > 0:
				require.True(t, ok)
				require.Equal(t, tt.wantDelay, delay)
			case tt.wantDelay < 0: // a date in the past: retry now
				require.True(t, ok)
				require.Zero(t, delay)
			default:
				require.False(t, ok)
			}
			require.Equal(t, 0, b.r.Effects(key))

			_, err = b.c.Deliver(t.Context(), delivery(key))
			require.NoError(t, err, "the retry succeeds")
			require.Equal(t, 1, b.r.Effects(key))
		})
	}
}

// A Retry-After date is a time on the receiver's clock. Measured against the relay
// host's clock, one running five minutes ahead found "in 90 seconds" already past and
// retried at once (after the backoff), before the receiver asked, using up attempts on
// its refusals; one behind waited minutes longer than asked. It is measured from the
// answer's Date, the receiver's time when it answered.
func TestRetryAfterDateIsOnTheReceiversClock(t *testing.T) {
	t.Parallel()
	for name, off := range map[string]time.Duration{"ahead": 5 * time.Minute, "behind": -5 * time.Minute} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, receiver.Options{}, webhook.Config{NowFunc: func() time.Time { return time.Now().Add(off) }})
			answered := time.Now().UTC().Truncate(time.Second) // the receiver's clock
			b.r.Plan("k", receiver.Plan{FailFirst: 1, FailStatus: 429, Date: answered.Format(http.TimeFormat),
				RetryAfter: answered.Add(90 * time.Second).Format(http.TimeFormat)})
			_, err := b.c.Deliver(t.Context(), delivery("k"))
			require.Error(t, err)
			delay, ok := connectors.RetryDelay(err)
			require.True(t, ok, "%v", err)
			require.Equal(t, 90*time.Second, delay)
		})
	}
}

func TestDeliver_Permanent(t *testing.T) {
	t.Parallel()
	b := setup(t, receiver.Options{}, webhook.Config{})

	for _, status := range []int{400, 404, 422} {
		key := fmt.Sprintf("permanent-%d", status)
		b.r.Plan(key, receiver.Plan{PermanentStatus: status})
		raw, err := b.c.Deliver(t.Context(), delivery(key))
		require.True(t, connectors.IsPermanent(err), "%d: %v", status, err)
		require.False(t, connectors.IsAmbiguous(err))
		require.Contains(t, err.Error(), fmt.Sprintf("receiver answered %d %s: ", status, http.StatusText(status)))
		res := decodeResult(t, raw)
		require.Equal(t, status, res.Status)
		require.Contains(t, res.Body, "planned permanent failure")
		require.Equal(t, 0, b.r.Effects(key))
	}
}

// Redirects are not followed. 303 See Other answers a POST the server took: the receiver
// may have acted, so that attempt is ambiguous as well as final, not a redirect to fix
// by configuration.
func TestDeliver_RedirectNotFollowed(t *testing.T) {
	t.Parallel()
	var followed atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/moved" {
			followed.Add(1)
			return
		}
		code, _ := strconv.Atoi(r.URL.Query().Get("code"))
		http.Redirect(w, r, "/moved?token=s3cret", code) // a path and query that may hold a token
	}))
	t.Cleanup(srv.Close)

	for _, tt := range []struct {
		code      int
		ambiguous bool
		says      string
	}{
		{http.StatusFound, false, "a redirect to " + srv.URL + "/xxxxx, not followed); configure the final URL instead"},
		{http.StatusPermanentRedirect, false, "a redirect to " + srv.URL + "/xxxxx, not followed); configure the final URL instead"},
		{http.StatusSeeOther, true, "points elsewhere for its outcome, not followed); it may have acted: check it before replaying the row"},
	} {
		c, err := webhook.New(webhook.Config{URL: fmt.Sprintf("%s/hook?code=%d", srv.URL, tt.code), Client: testClient(t)})
		require.NoError(t, err)
		raw, err := c.Deliver(t.Context(), delivery("k"))
		require.True(t, connectors.IsPermanent(err), "%v", err)
		require.Equal(t, tt.ambiguous, connectors.IsAmbiguous(err), "%v", err)
		require.Contains(t, err.Error(), fmt.Sprintf("receiver answered %d %s", tt.code, http.StatusText(tt.code)))
		require.Contains(t, err.Error(), tt.says)
		require.Equal(t, tt.code, decodeResult(t, raw).Status)
		require.NotContains(t, err.Error(), "s3cret")
	}
	require.Zero(t, followed.Load())
}

func TestDeliver_URLCredentials(t *testing.T) {
	t.Parallel()
	seen := make(chan string, 2) // the Authorization header of each request
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen <- r.Header.Get("Authorization")
	}))
	t.Cleanup(srv.Close)
	url := strings.Replace(srv.URL, "http://", "http://hook-user:s3cret@", 1) + "/hook"
	c, err := webhook.New(webhook.Config{URL: url, Client: testClient(t)})
	require.NoError(t, err)
	require.NotContains(t, c.String(), "s3cret")

	_, err = c.Deliver(t.Context(), delivery("k"))
	require.NoError(t, err)
	want := "Basic " + base64.StdEncoding.EncodeToString([]byte("hook-user:s3cret"))
	require.Equal(t, want, <-seen, "the URL's user and password, as HTTP Basic authentication")

	// A row's own Authorization header wins, as with net/http's client.
	d := delivery("k2")
	d.Headers = map[string]string{"authorization": "Bearer row-token"}
	_, err = c.Deliver(t.Context(), d)
	require.NoError(t, err)
	require.Equal(t, "Bearer row-token", <-seen)
}

func TestDeliver_SwitchingProtocols(t *testing.T) {
	t.Parallel()
	// The 101 must reach Deliver within the attempt's timeout (or Deliver rightly fails
	// with a timeout), so the timeout is generous for a busy machine; it is still well
	// short of the helper's watchdog, which a Deliver that reads the handed-over
	// connection reaches whatever the timeout, since the timeout does not bound that read.
	raw, err := connectortest.DeliverAfterProtocolSwitch(t, func(url string) connectors.Connector {
		c, err := webhook.New(webhook.Config{URL: url + "/hook", Client: testClient(t), Timeout: 10 * time.Second})
		require.NoError(t, err)
		return c
	}, delivery("k"))
	require.True(t, connectors.IsPermanent(err), "%v", err)
	require.Contains(t, err.Error(), "receiver answered 101 Switching Protocols")
	require.Equal(t, http.StatusSwitchingProtocols, decodeResult(t, raw).Status)
}

func TestDeliver_Signature(t *testing.T) {
	t.Parallel()
	other := "whsec_" + base64.StdEncoding.EncodeToString([]byte("not the receiver's secret"))

	t.Run("RightSecret", func(t *testing.T) {
		t.Parallel()
		b := setup(t, receiver.Options{Secret: testSecret}, webhook.Config{Secret: testSecret})
		_, err := b.c.Deliver(t.Context(), delivery("k"))
		require.NoError(t, err)
		e := b.r.EffectLog()[0]
		require.Equal(t, "k", e.Headers.Get("Webhook-Id"))
		require.Regexp(t, `^v1,[A-Za-z0-9+/]{43}=$`, e.Headers.Get("Webhook-Signature"))
	})

	for name, secret := range map[string]string{"WrongSecret": other, "NoSecret": ""} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, receiver.Options{Secret: testSecret}, webhook.Config{Secret: secret})
			raw, err := b.c.Deliver(t.Context(), delivery("k"))
			require.True(t, connectors.IsPermanent(err), "%v", err)
			require.Contains(t, err.Error(), "receiver answered 401 Unauthorized")
			require.Equal(t, http.StatusUnauthorized, decodeResult(t, raw).Status)
			require.Equal(t, 0, b.r.Effects("k"))
			if secret != "" {
				require.NotContains(t, err.Error(), strings.TrimPrefix(secret, "whsec_"))
			}
		})
	}

	// The published example, checked on the wire: the receiver logs the headers as sent.
	t.Run("SpecVector", func(t *testing.T) {
		t.Parallel()
		b := setup(t, receiver.Options{}, webhook.Config{
			Secret:  testSecret,
			NowFunc: func() time.Time { return time.Unix(1614265330, 0) },
		})
		_, err := b.c.Deliver(t.Context(), connectors.Delivery{
			Key:     "msg_p5jXN8AQM9LWM0D4loKWxJek",
			Attempt: 1,
			Payload: json.RawMessage(`{"test": 2432232314}`),
		})
		require.NoError(t, err)
		h := b.r.EffectLog()[0].Headers
		require.Equal(t, "msg_p5jXN8AQM9LWM0D4loKWxJek", h.Get("webhook-id"))
		require.Equal(t, "1614265330", h.Get("webhook-timestamp"))
		require.Equal(t, "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=", h.Get("webhook-signature"))
	})
}

// TestDeliver_SecretRotation walks a secret's rotation against real receivers that
// verify signatures: the sender signs with the old secret alone, then with the old and
// the new, then with the new alone, while receivers hold the old secret, the new, or both.
// Signed with both, every receiver accepts the row, so receivers can move to the new
// secret one at a time, before the sender drops the old one.
func TestDeliver_SecretRotation(t *testing.T) {
	t.Parallel()
	old := "whsec_" + base64.StdEncoding.EncodeToString([]byte("the old secret, being retired"))
	senders := []struct {
		name    string
		cfg     webhook.Config
		signs   []string // the secrets it signs with
		wantSig int      // signatures in its header
	}{
		{"Old", webhook.Config{Secret: old}, []string{old}, 1},
		{"OldThenNew", webhook.Config{Secret: old + " " + testSecret}, []string{old, testSecret}, 2},
		{"OldThenNewOnLines", webhook.Config{Secret: "\n" + old + "\n\t" + testSecret + "\n"}, []string{old, testSecret}, 2},
		{"OldThenNewSecrets", webhook.Config{Secrets: []string{old, testSecret}}, []string{old, testSecret}, 2},
		{"New", webhook.Config{Secret: testSecret}, []string{testSecret}, 1},
	}
	receivers := []struct {
		name string
		opts receiver.Options
		has  []string
	}{
		{"ReceiverOld", receiver.Options{Secret: old}, []string{old}},
		{"ReceiverNew", receiver.Options{Secret: testSecret}, []string{testSecret}},
		{"ReceiverBoth", receiver.Options{Secret: old, Secrets: []string{testSecret}}, []string{old, testSecret}},
	}
	for _, snd := range senders {
		for _, rcv := range receivers {
			t.Run(snd.name+"/"+rcv.name, func(t *testing.T) {
				t.Parallel()
				b := setup(t, rcv.opts, snd.cfg)
				raw, err := b.c.Deliver(t.Context(), delivery("k"))
				shared := slices.ContainsFunc(snd.signs, func(s string) bool { return slices.Contains(rcv.has, s) })
				if !shared {
					// What a rotation done in one step risks: 401, permanent, the row dead.
					require.True(t, connectors.IsPermanent(err), "%v", err)
					require.Contains(t, err.Error(), "receiver answered 401 Unauthorized")
					require.Equal(t, 0, b.r.Effects("k"))
					return
				}
				require.NoError(t, err)
				require.Equal(t, http.StatusOK, decodeResult(t, raw).Status)
				require.Equal(t, 1, b.r.Effects("k"))
				h := b.r.EffectLog()[0].Headers
				require.Equal(t, "k", h.Get("Webhook-Id"), "the id is the key, however many secrets")
				require.Len(t, strings.Split(h.Get("Webhook-Signature"), " "), snd.wantSig)
			})
		}
	}
}

// TestDeliver_SignatureList checks the header on the wire against the specification's
// example: one "v1," signature per secret, in the order configured, separated by single
// spaces (the reference libraries split the list at " "), each the signature that secret
// alone makes; the id, timestamp and body are those of an unrotated request.
func TestDeliver_SignatureList(t *testing.T) {
	t.Parallel()
	other := "whsec_" + base64.StdEncoding.EncodeToString([]byte("the new secret, replacing it"))
	at := func() time.Time { return time.Unix(1614265330, 0) }
	d := connectors.Delivery{
		Key:     "msg_p5jXN8AQM9LWM0D4loKWxJek",
		Attempt: 1,
		Payload: json.RawMessage(`{"test": 2432232314}`),
	}
	sent := func(cfg webhook.Config) http.Header {
		t.Helper()
		cfg.NowFunc = at
		b := setup(t, receiver.Options{}, cfg)
		_, err := b.c.Deliver(t.Context(), d)
		require.NoError(t, err)
		return b.r.EffectLog()[0].Headers
	}
	const specSig = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
	otherSig := sent(webhook.Config{Secret: other}).Get("webhook-signature")
	require.NotEqual(t, specSig, otherSig)

	for _, cfg := range []webhook.Config{
		{Secret: testSecret + " " + other},
		{Secret: " " + testSecret + "\t\r\n " + other + "\n"},
		{Secrets: []string{testSecret, other}},
	} {
		h := sent(cfg)
		require.Equal(t, specSig+" "+otherSig, h.Get("webhook-signature"))
		require.Equal(t, "msg_p5jXN8AQM9LWM0D4loKWxJek", h.Get("webhook-id"))
		require.Equal(t, "1614265330", h.Get("webhook-timestamp"))
	}
	require.Equal(t, otherSig+" "+specSig, sent(webhook.Config{Secrets: []string{other, testSecret}}).Get("webhook-signature"),
		"in the order given")

	// A blank value, like an empty one, sends unsigned requests.
	for _, cfg := range []webhook.Config{{Secret: " \t\n"}, {Secrets: []string{}}} {
		h := sent(cfg)
		for _, name := range []string{"webhook-id", "webhook-timestamp", "webhook-signature"} {
			require.Empty(t, h.Get(name), name)
		}
	}
}

func TestDeliver_Timeout(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	// Long enough for a slow machine to send the request and the receiver to act within
	// it; the receiver then holds its answer until the connector has given up.
	b := setup(t, receiver.Options{OnEffect: func(receiver.Effect) { <-release }},
		webhook.Config{Timeout: time.Second, Guarantee: connectors.Enforced})

	// The receiver holds the request until the connector has given up on it.
	raw, err := b.c.Deliver(t.Context(), delivery("k"))
	close(release)
	require.Error(t, err)
	require.Nil(t, raw)
	require.ErrorIs(t, err, webhook.ErrTimeout)
	require.True(t, connectors.IsAmbiguous(err), "%v", err)
	require.False(t, connectors.IsPermanent(err))
	require.Contains(t, err.Error(), "no answer within 1s after the request was sent; the receiver may have acted")
	require.Equal(t, 1, b.r.Effects("k"))
}

func TestDeliver_NotSent(t *testing.T) {
	t.Parallel()

	t.Run("ConnectionRefused", func(t *testing.T) {
		t.Parallel()
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		url := "http://" + ln.Addr().String() + "/hook"
		require.NoError(t, ln.Close())
		c, err := webhook.New(webhook.Config{URL: url, Client: testClient(t)})
		require.NoError(t, err)

		raw, err := c.Deliver(t.Context(), delivery("k"))
		require.Error(t, err)
		require.Nil(t, raw)
		require.False(t, connectors.IsAmbiguous(err), "nothing was sent: %v", err)
		require.False(t, connectors.IsPermanent(err))
		require.Contains(t, err.Error(), "POST "+connectors.RedactEndpoint(url)+": the request could not be sent: ")
	})

	t.Run("Cancelled", func(t *testing.T) {
		t.Parallel()
		b := setup(t, receiver.Options{}, webhook.Config{})
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		_, err := b.c.Deliver(ctx, delivery("k"))
		require.ErrorIs(t, err, context.Canceled)
		require.False(t, connectors.IsAmbiguous(err))
		require.False(t, connectors.IsPermanent(err))
		require.Equal(t, 0, b.r.Requests("k"))
	})
}

func TestDeliver_InvalidRow(t *testing.T) {
	t.Parallel()
	b := setup(t, receiver.Options{}, webhook.Config{})

	for name, d := range map[string]connectors.Delivery{
		"NoKey":      {Payload: json.RawMessage(`{}`)},
		"NotJSON":    {Key: "k", Payload: json.RawMessage(`{`)},
		"BadHeader":  {Key: "k", Payload: json.RawMessage(`{}`), Headers: map[string]string{"X-Evil": "a\r\nInjected: yes"}},
		"BadHdrName": {Key: "k", Payload: json.RawMessage(`{}`), Headers: map[string]string{"bad name": "v"}},
		// The outbox accepts any text as a key; one with a control character cannot be
		// an Idempotency-Key header, and no retry will change that.
		"KeyNotAHeader": {Key: "k\nInjected: yes", Payload: json.RawMessage(`{}`)},
		// HTTP drops white space around a header value: the receiver would see "k".
		"KeyEndsInSpace":   {Key: "k ", Payload: json.RawMessage(`{}`)},
		"KeyStartsWithTab": {Key: "\tk", Payload: json.RawMessage(`{}`)},
	} {
		_, err := b.c.Deliver(t.Context(), d)
		require.True(t, connectors.IsPermanent(err), "%s: %v", name, err)
	}
	require.Equal(t, 0, b.r.Requests("k"))
}

// Two rows whose keys differ only by white space at an end are two operations. HTTP
// drops that white space, so the second reached an enforcing receiver as the first's key
// and was answered with the first's stored result, marked delivered though nothing was
// done for it (and its webhook-id signature, over the untrimmed key, never verified).
func TestDeliver_KeyWithSurroundingSpaceIsNotSentAsAnotherKey(t *testing.T) {
	t.Parallel()
	b := setup(t, receiver.Options{Secret: testSecret}, webhook.Config{Guarantee: connectors.Enforced, Secret: testSecret})
	_, err := b.c.Deliver(t.Context(), delivery("order-42"))
	require.NoError(t, err)
	for _, key := range []string{"order-42 ", " order-42", "order-42\t"} {
		_, err = b.c.Deliver(t.Context(), delivery(key))
		require.True(t, connectors.IsPermanent(err), "%q: %v", key, err)
		require.ErrorContains(t, err, `the receiver would see the key "order-42"`)
	}
	require.Equal(t, 1, b.r.TotalEffects())
	require.Equal(t, 1, b.r.Requests("order-42"), "no second request under the first row's key")
}

func TestDeliver_ResultExcerpt(t *testing.T) {
	t.Parallel()
	body := strings.Repeat("é", 3000) // 2 bytes each, so a 9-byte cut falls inside a rune
	var conns atomic.Int64
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		status := http.StatusOK
		if r.Header.Get("Idempotency-Key") == "fail" {
			status = http.StatusBadGateway
		}
		w.WriteHeader(status)
		_, _ = w.Write([]byte(body))
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Start()
	t.Cleanup(srv.Close)
	c, err := webhook.New(webhook.Config{URL: srv.URL, MaxResultBody: 9, Client: testClient(t)})
	require.NoError(t, err)

	for range 5 {
		raw, err := c.Deliver(t.Context(), delivery("ok"))
		require.NoError(t, err)
		res := decodeResult(t, raw)
		require.Equal(t, "éééé", res.Body)
		require.True(t, res.Truncated)
		require.Contains(t, string(raw), `"truncated":true`)
	}
	// Each answer's unread body was drained, so one connection carried all five.
	require.Equal(t, int64(1), conns.Load())

	raw, err := c.Deliver(t.Context(), delivery("fail"))
	require.Error(t, err)
	require.Contains(t, err.Error(), "receiver answered 502 Bad Gateway: éééé")
	res := decodeResult(t, raw)
	require.Equal(t, http.StatusBadGateway, res.Status)
	require.True(t, utf8.ValidString(res.Body))
}

func TestNew_Validation(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		cfg  webhook.Config
		want string
	}{
		{"NoURL", webhook.Config{}, "URL: required"},
		{"BadURL", webhook.Config{URL: "http://a b:s3cr3t@x/%zz"}, "URL: does not parse"},
		{"Relative", webhook.Config{URL: "/hook"}, "URL: scheme must be http or https"},
		{"FTP", webhook.Config{URL: "ftp://127.0.0.1/hook"}, `URL: scheme must be http or https, not "ftp"`},
		{"NoHost", webhook.Config{URL: "http:///hook"}, "URL: has no host"},
		{"PortOnly", webhook.Config{URL: "http://:80/hook"}, "URL: has no host"},
		// A space at the end would be sent as part of the path (%20).
		{"TrailingSpace", webhook.Config{URL: "http://127.0.0.1/hook "}, "URL: begins or ends with white space"},
		{"LeadingSpace", webhook.Config{URL: " http://127.0.0.1/hook"}, "URL: begins or ends with white space"},
		{"SecretPrefix", webhook.Config{URL: "http://127.0.0.1/", Secret: "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"}, `Secret: must start with "whsec_"`},
		{"SecretBase64", webhook.Config{URL: "http://127.0.0.1/", Secret: "whsec_not*base64"}, "Secret: the part after \"whsec_\" is not valid base64"},
		{"SecretEmpty", webhook.Config{URL: "http://127.0.0.1/", Secret: "whsec_"}, "Secret: nothing after"},
		// Among several, the bad one is named by its place, not quoted.
		{"SecretListPrefix", webhook.Config{URL: "http://127.0.0.1/", Secret: testSecret + " MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"}, `Secret (secret 2 of 2): must start with "whsec_"`},
		{"SecretListBase64", webhook.Config{URL: "http://127.0.0.1/", Secret: "whsec_not*base64\n" + testSecret}, `Secret (secret 1 of 2): the part after "whsec_" is not valid base64`},
		{"SecretsPrefix", webhook.Config{URL: "http://127.0.0.1/", Secrets: []string{testSecret, "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"}}, `Secrets[1]: must start with "whsec_"`},
		{"SecretsBlank", webhook.Config{URL: "http://127.0.0.1/", Secrets: []string{" "}}, `Secrets[0]: must start with "whsec_"`},
		{"SecretAndSecrets", webhook.Config{URL: "http://127.0.0.1/", Secret: testSecret, Secrets: []string{testSecret}}, "Secret and Secrets: both are set"},
		{"Timeout", webhook.Config{URL: "http://127.0.0.1/", Timeout: -time.Second}, "Timeout: -1s is negative"},
		{"MaxResultBody", webhook.Config{URL: "http://127.0.0.1/", MaxResultBody: -1}, "MaxResultBody: -1 is negative"},
		{"Guarantee", webhook.Config{URL: "http://127.0.0.1/", Guarantee: "maybe"}, `Guarantee: "maybe" is not enforced or forwarded`},
		// It never looks up what the receiver did before a retry.
		{"Reconciled", webhook.Config{URL: "http://127.0.0.1/", Guarantee: connectors.Reconciled}, "Guarantee: reconciled is not possible for a webhook"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c, err := webhook.New(tt.cfg)
			require.Nil(t, c)
			require.ErrorContains(t, err, "webhook config: "+tt.want)
			require.NotContains(t, err.Error(), "s3cr3t", "a password in the URL stays out of errors")
			for _, secret := range append(strings.Fields(tt.cfg.Secret), tt.cfg.Secrets...) {
				if raw := strings.TrimSpace(strings.TrimPrefix(secret, "whsec_")); raw != "" {
					require.NotContains(t, err.Error(), raw)
				}
			}
		})
	}

	t.Run("EveryProblemAtOnce", func(t *testing.T) {
		t.Parallel()
		_, err := webhook.New(webhook.Config{URL: "ftp://x", Secret: "nope", Timeout: -1})
		require.Error(t, err)
		lines := strings.Split(err.Error(), "\n")
		require.Len(t, lines, 3)
		for _, l := range lines {
			require.True(t, strings.HasPrefix(l, "webhook config: "), l)
		}
	})

	// One line per bad secret, so that each can be found and fixed.
	t.Run("EveryBadSecret", func(t *testing.T) {
		t.Parallel()
		for cfg, want := range map[*webhook.Config][]string{
			{URL: "http://127.0.0.1/", Secret: "nope " + testSecret + " whsec_"}: {
				`webhook config: Secret (secret 1 of 3): must start with "whsec_"`,
				`webhook config: Secret (secret 3 of 3): nothing after "whsec_"`,
			},
			{URL: "http://127.0.0.1/", Secrets: []string{"nope", testSecret, "whsec_"}}: {
				`webhook config: Secrets[0]: must start with "whsec_"`,
				`webhook config: Secrets[2]: nothing after "whsec_"`,
			},
		} {
			_, err := webhook.New(*cfg)
			require.Error(t, err)
			lines := strings.Split(err.Error(), "\n")
			require.Len(t, lines, len(want), err.Error())
			for i, w := range want {
				require.True(t, strings.HasPrefix(lines[i], w), "%q does not start with %q", lines[i], w)
			}
		}
	})

	t.Run("Valid", func(t *testing.T) {
		t.Parallel()
		for _, u := range []string{"http://127.0.0.1:8080/hook", "https://example.com/hooks?tenant=1"} {
			c, err := webhook.New(webhook.Config{URL: u, Secret: testSecret, Guarantee: connectors.Enforced})
			require.NoError(t, err, u)
			require.Equal(t, connectors.Enforced, c.Guarantee())
		}
	})
}

func TestConfig_LogValueRedactsSecret(t *testing.T) {
	t.Parallel()
	cfg := webhook.Config{URL: "https://user:hunter2@example.com/hook", Secret: testSecret}
	s := cfg.LogValue().String()
	require.NotContains(t, s, "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
	require.NotContains(t, s, "hunter2")
	require.Contains(t, s, "REDACTED")

	s = webhook.Config{URL: "https://example.com/hook", Secrets: []string{testSecret}}.LogValue().String()
	require.NotContains(t, s, "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
	require.Contains(t, s, "REDACTED")
}

// A Config printed with fmt (an application's own log line, a %+v in an error) showed
// its secrets, and the URL's password and path, which may hold a token; the other
// connectors' configurations redact them in every form.
func TestConfig_PrintedFormsRedactSecrets(t *testing.T) {
	t.Parallel()
	for _, cfg := range []webhook.Config{
		{URL: "https://user:hunter2@example.com/hooks/T0K3N?sig=s3cret", Secret: testSecret},
		{URL: "https://example.com/hooks/T0K3N", Secrets: []string{testSecret}},
	} {
		for _, s := range []string{fmt.Sprint(cfg), fmt.Sprintf("%v", cfg), fmt.Sprintf("%+v", cfg), fmt.Sprintf("%#v", cfg)} {
			for _, secret := range []string{"MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "hunter2", "T0K3N", "s3cret"} {
				require.NotContains(t, s, secret)
			}
			require.Contains(t, s, "REDACTED")
			require.Contains(t, s, "example.com")
		}
	}
}

func TestDefaultTransport(t *testing.T) {
	t.Parallel()
	tr := webhook.DefaultTransport()
	require.Same(t, tr, webhook.DefaultTransport(), "one transport, shared")
	require.Equal(t, 512, tr.MaxIdleConnsPerHost)
	require.Equal(t, 90*time.Second, tr.IdleConnTimeout)
	require.NotSame(t, http.DefaultTransport, tr)
}

func TestNew_DoesNotChangeCallersClient(t *testing.T) {
	t.Parallel()
	client := testClient(t)
	_, err := webhook.New(webhook.Config{URL: "http://127.0.0.1/", Client: client})
	require.NoError(t, err)
	require.Nil(t, client.CheckRedirect)
}

// Neither the signing secret nor what a URL may hold as a token (password, path, query)
// shows in what the connector prints, nor in its errors, which reach last_error and so
// the agents that read rows through the intent API.
func TestConnector_NeverShowsSecret(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close()) // nothing listens there now: the attempt fails
	c, err := webhook.New(webhook.Config{URL: "http://user:hunter2@" + addr + "/services/T0KEN?sig=s1gnature",
		Secret: testSecret, Client: testClient(t)})
	require.NoError(t, err)
	_, deliverErr := c.Deliver(t.Context(), delivery("k"))
	require.Error(t, deliverErr)
	for _, s := range []string{fmt.Sprint(c), fmt.Sprintf("%+v", c), fmt.Sprintf("%#v", c), c.LogValue().String(), deliverErr.Error()} {
		for _, secret := range []string{"MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "hunter2", "T0KEN", "s1gnature"} {
			require.NotContains(t, s, secret)
		}
	}
	require.Equal(t, "webhook http://"+addr+"/xxxxx", c.String())
}
