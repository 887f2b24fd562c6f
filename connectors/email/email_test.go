package email_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"mime/multipart"
	"net"
	"net/mail"
	"net/textproto"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/connectors"
	"github.com/outboxd/outboxd/connectors/connectortest"
	"github.com/outboxd/outboxd/connectors/email"
)

const testFrom = "Shop <orders@shop.example>"

var testNow = time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)

type testBundle struct {
	srv *testServer
	c   *email.Connector
}

// setup starts a server with opts and a connector for it with cfg; cfg.Addr defaults to
// the server's, cfg.From to testFrom, cfg.TLSConfig to one trusting the server.
func setup(t *testing.T, opts serverOptions, cfg email.Config) *testBundle {
	t.Helper()
	srv := startServer(t, opts)
	cfg.Addr = cmpOr(cfg.Addr, srv.addr)
	cfg.From = cmpOr(cfg.From, testFrom)
	if cfg.TLSConfig == nil {
		cfg.TLSConfig = srv.tls
	}
	if cfg.NowFunc == nil {
		cfg.NowFunc = func() time.Time { return testNow }
	}
	c, err := email.New(cfg)
	require.NoError(t, err)
	return &testBundle{srv: srv, c: c}
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

func delivery(key string, payload string) connectors.Delivery {
	return connectors.Delivery{
		Key:     key,
		Attempt: 1,
		Payload: json.RawMessage(payload),
		Headers: map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},
	}
}

// wantMessageID computes the Message-ID independently of the package.
func wantMessageID(key, domain string) string {
	sum := sha256.Sum256([]byte(key))
	return "<" + hex.EncodeToString(sum[:])[:32] + "@" + domain + ">"
}

func decodeResult(t *testing.T, raw json.RawMessage) email.Result {
	t.Helper()
	var res email.Result
	require.NoError(t, json.Unmarshal(raw, &res), "result %s", raw)
	return res
}

func TestConformance(t *testing.T) {
	t.Parallel()
	srv := startServer(t, serverOptions{})
	c, err := email.New(email.Config{Addr: srv.addr, From: testFrom})
	require.NoError(t, err)
	connectortest.Run(t, connectortest.Harness{
		Connector: c,
		PayloadFunc: func(i int) json.RawMessage {
			return json.RawMessage(fmt.Sprintf(`{"to":"user%d@example.com","subject":"row %d","text":"hello %d"}`, i, i, i))
		},
		EffectsFunc:         srv.Effects,
		DropAfterEffectFunc: srv.DropAfterData,
	})
}

func TestDeliver_Success(t *testing.T) {
	t.Parallel()
	b := setup(t, serverOptions{}, email.Config{})

	const key = "order-42:notify/customer"
	raw, err := b.c.Deliver(t.Context(), delivery(key, `{
		"to": ["Ann <ann@example.com>", "bob@example.com"],
		"cc": "carol@example.com",
		"bcc": ["audit@example.com"],
		"reply_to": "support@shop.example",
		"subject": "Your order shipped — №42",
		"text": "Plain body",
		"html": "<p>HTML body</p>",
		"headers": {"X-Tenant": "acme"}
	}`))
	require.NoError(t, err)

	msgID := wantMessageID(key, "shop.example")
	res := decodeResult(t, raw)
	require.Equal(t, msgID, res.MessageID)
	require.Equal(t, []string{"ann@example.com", "bob@example.com", "carol@example.com", "audit@example.com"}, res.Accepted)
	require.True(t, strings.HasPrefix(res.ServerReply, "250 "), "%q", res.ServerReply)
	require.Contains(t, string(raw), `"message_id":"`+msgID+`"`, "the result keeps < and > readable")

	msgs := b.srv.ByMessageID(msgID)
	require.Len(t, msgs, 1)
	m := msgs[0]
	h := m.Header
	require.Equal(t, key, h.Get("Idempotency-Key"))
	require.Equal(t, "orders@shop.example", m.From, "envelope sender")
	require.ElementsMatch(t, res.Accepted, m.Rcpts, "bcc is an envelope recipient")
	require.Empty(t, h.Get("Bcc"), "bcc is not a header")
	require.NotContains(t, headerText(h), "audit@example.com")

	dec := new(mime.WordDecoder)
	subject, err := dec.DecodeHeader(h.Get("Subject"))
	require.NoError(t, err)
	require.Equal(t, "Your order shipped — №42", subject)
	from, err := mail.ParseAddress(h.Get("From"))
	require.NoError(t, err)
	require.Equal(t, "orders@shop.example", from.Address)
	to, err := h.AddressList("To")
	require.NoError(t, err)
	require.Equal(t, []string{"ann@example.com", "bob@example.com"}, addrs(to))
	require.Equal(t, "Ann", to[0].Name)
	cc, err := h.AddressList("Cc")
	require.NoError(t, err)
	require.Equal(t, []string{"carol@example.com"}, addrs(cc))
	replyTo, err := h.AddressList("Reply-To")
	require.NoError(t, err)
	require.Equal(t, []string{"support@shop.example"}, addrs(replyTo))
	require.Equal(t, "acme", h.Get("X-Tenant"))
	require.Empty(t, h.Get("Traceparent"), "the row's headers are not copied into the mail")
	date, err := h.Date()
	require.NoError(t, err)
	require.True(t, testNow.Equal(date), "Date comes from NowFunc: %s", date)

	// text and html together make a multipart/alternative with both parts.
	mediaType, params, err := mime.ParseMediaType(h.Get("Content-Type"))
	require.NoError(t, err)
	require.Equal(t, "multipart/alternative", mediaType)
	mr := multipart.NewReader(bytes.NewReader(m.Body), params["boundary"])
	var types []string
	for {
		p, err := mr.NextPart()
		if err != nil {
			break
		}
		ct, _, _ := mime.ParseMediaType(p.Header.Get("Content-Type"))
		types = append(types, ct)
	}
	require.Equal(t, []string{"text/plain", "text/html"}, types)

	require.Equal(t, connectors.Forwarded, b.c.Guarantee())
}

func headerText(h mail.Header) string {
	var sb strings.Builder
	for k, vs := range h {
		sb.WriteString(k + ": " + strings.Join(vs, ", ") + "\n")
	}
	return sb.String()
}

func addrs(list []*mail.Address) []string {
	out := make([]string, len(list))
	for i, a := range list {
		out[i] = a.Address
	}
	return out
}

func TestDeliver_SingleBody(t *testing.T) {
	t.Parallel()
	b := setup(t, serverOptions{}, email.Config{})
	for _, tt := range []struct{ field, want string }{{"text", "text/plain"}, {"html", "text/html"}} {
		key := "single-" + tt.field
		_, err := b.c.Deliver(t.Context(), delivery(key, `{"to":"a@example.com","`+tt.field+`":"body"}`))
		require.NoError(t, err)
		msgs := b.srv.ByMessageID(wantMessageID(key, "shop.example"))
		require.Len(t, msgs, 1)
		ct, _, err := mime.ParseMediaType(msgs[0].Header.Get("Content-Type"))
		require.NoError(t, err)
		require.Equal(t, tt.want, ct)
	}
}

// The failure that matters most: the server takes the whole message, then the
// connection drops before its reply. The attempt is ambiguous; the retry carries the same
// Message-ID, so a receiver that dedupes on it would keep one copy.
func TestDeliver_DropAfterData(t *testing.T) {
	t.Parallel()
	b := setup(t, serverOptions{}, email.Config{})
	const key = "order-7:receipt"
	d := delivery(key, `{"to":"a@example.com","subject":"receipt","text":"thanks"}`)
	b.srv.DropAfterData(key)

	raw, err := b.c.Deliver(t.Context(), d)
	require.Error(t, err)
	require.Nil(t, raw)
	require.True(t, connectors.IsAmbiguous(err), "%v", err)
	require.False(t, connectors.IsPermanent(err), "%v", err)
	require.Contains(t, err.Error(), "no reply after the message was sent; the server may have accepted it")
	require.Equal(t, 1, b.srv.Effects(key))

	d.Attempt, d.PreviousAmbiguous = 2, true
	raw, err = b.c.Deliver(t.Context(), d)
	require.NoError(t, err)
	msgID := wantMessageID(key, "shop.example")
	require.Equal(t, msgID, decodeResult(t, raw).MessageID)

	msgs := b.srv.ByMessageID(msgID)
	require.Len(t, msgs, 2, "the server got the message twice, under one Message-ID")
	require.Equal(t, msgs[0].Header.Get("Message-Id"), msgs[1].Header.Get("Message-Id"))
	require.Equal(t, key, msgs[1].Header.Get("Idempotency-Key"))
	seen := map[string]bool{}
	for _, m := range b.srv.Messages() {
		seen[m.Header.Get("Message-Id")] = true
	}
	require.Len(t, seen, 1, "a receiver deduping on Message-ID keeps one")
}

func TestDeliver_Replies(t *testing.T) {
	t.Parallel()
	b := setup(t, serverOptions{}, email.Config{})

	tests := []struct {
		name      string
		payload   string
		code      int
		permanent bool
		step      string
	}{
		{"Rcpt451", `{"to":["ok@example.com","rcpt451@example.com"],"text":"x"}`, 451, false, "RCPT TO"},
		{"Rcpt550", `{"to":"ok@example.com","bcc":"rcpt550@example.com","text":"x"}`, 550, true, "RCPT TO"},
		{"RcptMixed", `{"to":["rcpt451@example.com","rcpt550@example.com"],"text":"x"}`, 0, true, "RCPT TO"},
		{"Data451", `{"to":"ok@example.com","text":"x","headers":{"X-Test-Data-Reply":"451"}}`, 451, false, "end of DATA"},
		{"Data554", `{"to":"ok@example.com","text":"x","headers":{"X-Test-Data-Reply":"554"}}`, 554, true, "end of DATA"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			key := "replies:" + tt.name
			raw, err := b.c.Deliver(t.Context(), delivery(key, tt.payload))
			require.Error(t, err)
			require.Nil(t, raw)
			require.Equal(t, tt.permanent, connectors.IsPermanent(err), "%v", err)
			require.False(t, connectors.IsAmbiguous(err), "the server refused, so it did not act: %v", err)
			require.Contains(t, err.Error(), tt.step)
			require.Contains(t, err.Error(), "scripted refusal", "the reply text is kept")
			if tt.code != 0 {
				te, ok := errors.AsType[*textproto.Error](err)
				require.True(t, ok, "%v", err)
				require.Equal(t, tt.code, te.Code)
			}
			require.Equal(t, 0, b.srv.Effects(key))
		})
	}
}

func TestDeliver_Auth(t *testing.T) {
	t.Parallel()
	const user, pass = "relay", "s3cret-pa55"
	d := delivery("auth:1", `{"to":"a@example.com","text":"x"}`)

	// Over STARTTLS as on a real submission port, and in clear on loopback (which go-mail
	// allows for PLAIN, as net/smtp does).
	for _, startTLS := range []bool{true, false} {
		t.Run(fmt.Sprintf("StartTLS=%t", startTLS), func(t *testing.T) {
			t.Parallel()
			b := setup(t, serverOptions{StartTLS: startTLS, Username: user, Password: pass},
				email.Config{Username: user, Password: pass})
			_, err := b.c.Deliver(t.Context(), d)
			require.NoError(t, err)
			msgs := b.srv.Messages()
			require.Len(t, msgs, 1)
			require.Equal(t, user, msgs[0].AuthUser)
			require.Equal(t, startTLS, msgs[0].TLS)
		})
	}

	t.Run("WrongPassword", func(t *testing.T) {
		t.Parallel()
		b := setup(t, serverOptions{Username: user, Password: pass},
			email.Config{Username: user, Password: "wrong-" + pass})
		_, err := b.c.Deliver(t.Context(), d)
		require.Error(t, err)
		require.False(t, connectors.IsPermanent(err), "a configuration problem must not kill rows: %v", err)
		require.False(t, connectors.IsAmbiguous(err), "%v", err)
		require.Contains(t, err.Error(), "connect")
		require.NotContains(t, err.Error(), pass)
		require.Equal(t, 0, b.srv.Effects(d.Key))
	})
}

func TestDeliver_TLSPolicy(t *testing.T) {
	t.Parallel()
	d := delivery("tls:1", `{"to":"a@example.com","text":"x"}`)

	t.Run("OpportunisticWithoutOffer", func(t *testing.T) {
		t.Parallel()
		b := setup(t, serverOptions{}, email.Config{})
		_, err := b.c.Deliver(t.Context(), d)
		require.NoError(t, err)
		require.False(t, b.srv.Messages()[0].TLS)
	})
	t.Run("MandatoryWithOffer", func(t *testing.T) {
		t.Parallel()
		b := setup(t, serverOptions{StartTLS: true}, email.Config{TLS: email.TLSMandatory})
		_, err := b.c.Deliver(t.Context(), d)
		require.NoError(t, err)
		require.True(t, b.srv.Messages()[0].TLS)
	})
	t.Run("MandatoryWithoutOffer", func(t *testing.T) {
		t.Parallel()
		b := setup(t, serverOptions{}, email.Config{TLS: email.TLSMandatory})
		_, err := b.c.Deliver(t.Context(), d)
		require.Error(t, err)
		require.False(t, connectors.IsPermanent(err), "%v", err)
		require.False(t, connectors.IsAmbiguous(err), "%v", err)
		require.Contains(t, err.Error(), "STARTTLS")
		require.Empty(t, b.srv.Messages())
	})
	t.Run("None", func(t *testing.T) {
		t.Parallel()
		b := setup(t, serverOptions{StartTLS: true}, email.Config{TLS: email.TLSNone})
		_, err := b.c.Deliver(t.Context(), d)
		require.NoError(t, err)
		require.False(t, b.srv.Messages()[0].TLS)
	})
	// SMTPS (port 465): TLS from the first byte, then AUTH over it. A STARTTLS policy
	// there waits for a greeting the server never sends until the attempt times out, with
	// every row dead in the end; implicit speaks TLS first.
	t.Run("Implicit", func(t *testing.T) {
		t.Parallel()
		b := setup(t, serverOptions{ImplicitTLS: true, Username: "relay", Password: "pw"},
			email.Config{TLS: email.TLSImplicit, Username: "relay", Password: "pw"})
		_, err := b.c.Deliver(t.Context(), d)
		require.NoError(t, err)
		msgs := b.srv.Messages()
		require.Len(t, msgs, 1)
		require.True(t, msgs[0].TLS)
		require.Equal(t, "relay", msgs[0].AuthUser)
	})
	t.Run("ImplicitUntrustedCertificate", func(t *testing.T) {
		t.Parallel()
		srv := startServer(t, serverOptions{ImplicitTLS: true})
		c, err := email.New(email.Config{Addr: srv.addr, From: testFrom, TLS: email.TLSImplicit}) // system roots
		require.NoError(t, err)
		_, err = c.Deliver(t.Context(), d)
		require.Error(t, err)
		require.False(t, connectors.IsPermanent(err), "%v", err)
		require.False(t, connectors.IsAmbiguous(err), "nothing was sent: %v", err)
		require.Empty(t, srv.Messages())
	})
	t.Run("UntrustedCertificate", func(t *testing.T) {
		t.Parallel()
		srv := startServer(t, serverOptions{StartTLS: true})
		c, err := email.New(email.Config{Addr: srv.addr, From: testFrom}) // system roots
		require.NoError(t, err)
		_, err = c.Deliver(t.Context(), d)
		require.Error(t, err)
		require.False(t, connectors.IsPermanent(err), "%v", err)
		require.False(t, connectors.IsAmbiguous(err), "%v", err)
		require.Empty(t, srv.Messages())
	})
}

func TestDeliver_DialRefused(t *testing.T) {
	t.Parallel()
	c, err := email.New(email.Config{Addr: refusedAddr(t), From: testFrom})
	require.NoError(t, err)
	_, err = c.Deliver(t.Context(), delivery("refused:1", `{"to":"a@example.com","text":"x"}`))
	require.Error(t, err)
	require.False(t, connectors.IsPermanent(err), "%v", err)
	require.False(t, connectors.IsAmbiguous(err), "nothing was sent: %v", err)
	require.Contains(t, err.Error(), "connect")
}

// An attempt ends when its context does at any point of the conversation, the server's
// greeting, EHLO and the rest included: go-mail's own deadline covers each step alone,
// so a stop (or the attempt's timeout) would otherwise wait out the step in progress,
// and a slow server could hold the attempt, and its row's lease, for several timeouts.
func TestDeliver_EndsWithItsContextDuringTheGreeting(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	hangUp, gotEHLO := make(chan struct{}), make(chan struct{})
	t.Cleanup(func() { close(hangUp); ln.Close() })
	go func() {
		conn, err := ln.Accept()
		if err != nil {
			return
		}
		defer conn.Close()
		_, _ = io.WriteString(conn, "220 mx.test ESMTP\r\n")
		_, _ = bufio.NewReader(conn).ReadString('\n') // EHLO, never answered
		close(gotEHLO)
		<-hangUp
	}()
	c, err := email.New(email.Config{Addr: ln.Addr().String(), From: testFrom, Timeout: time.Hour})
	require.NoError(t, err)

	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() {
		_, err := c.Deliver(ctx, delivery("silent:1", `{"to":"a@example.com","text":"x"}`))
		done <- err
	}()
	<-gotEHLO
	cancel()
	select {
	case err = <-done:
	case <-time.After(time.Minute): // a watchdog, not a timing check: without the fix it waits an hour
		t.Fatal("Deliver still waits for an answer to EHLO")
	}
	require.ErrorIs(t, err, context.Canceled)
	require.False(t, connectors.IsPermanent(err), "%v", err)
	require.False(t, connectors.IsAmbiguous(err), "nothing of the message was sent: %v", err)
}

func TestDeliver_CancelledContext(t *testing.T) {
	t.Parallel()
	b := setup(t, serverOptions{}, email.Config{})
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	_, err := b.c.Deliver(ctx, delivery("cancelled:1", `{"to":"a@example.com","text":"x"}`))
	require.Error(t, err)
	require.ErrorIs(t, err, context.Canceled)
	require.False(t, connectors.IsPermanent(err), "%v", err)
	require.False(t, connectors.IsAmbiguous(err), "%v", err)
	require.Empty(t, b.srv.Messages())
}

func TestDeliver_BadRow(t *testing.T) {
	t.Parallel()
	b := setup(t, serverOptions{}, email.Config{})
	tests := []struct {
		name, key, payload, want string
	}{
		{"NoKey", "", `{"to":"a@example.com","text":"x"}`, "no idempotency key"},
		{"KeyWithNewline", "a\r\nBcc: evil@example.com", `{"to":"a@example.com","text":"x"}`, "control characters"},
		{"KeyEndsInSpace", "k ", `{"to":"a@example.com","text":"x"}`, `the receiver would see the key "k"`},
		{"NotJSON", "k", `{"to":`, "payload"},
		{"NoTo", "k", `{"text":"x"}`, `"to" is required`},
		{"EmptyToList", "k", `{"to":[],"text":"x"}`, `"to" is required`},
		{"ToNumber", "k", `{"to":5,"text":"x"}`, "string or an array"},
		{"BadAddress", "k", `{"to":"not an address","text":"x"}`, `"to": "not an address"`},
		{"BadCc", "k", `{"to":"a@example.com","cc":["b@"],"text":"x"}`, `"cc"`},
		{"NoBody", "k", `{"to":"a@example.com","subject":"s"}`, `"text" or "html" is required`},
		{"UnknownField", "k", `{"to":"a@example.com","body":"x"}`, `unknown field "body"`},
		{"ReservedMessageID", "k", `{"to":"a@example.com","text":"x","headers":{"message-id":"<x@y>"}}`, "cannot be overridden"},
		{"ReservedFrom", "k", `{"to":"a@example.com","text":"x","headers":{"From":"ceo@example.com"}}`, "cannot be overridden"},
		{"ReservedKey", "k", `{"to":"a@example.com","text":"x","headers":{"Idempotency-Key":"other"}}`, "cannot be overridden"},
		{"ReservedContentType", "k", `{"to":"a@example.com","text":"x","headers":{"Content-Type":"text/html"}}`, "cannot be overridden"},
		{"BadHeaderName", "k", `{"to":"a@example.com","text":"x","headers":{"X Bad":"v"}}`, "not a valid header name"},
		{"HeaderInjection", "k", `{"to":"a@example.com","text":"x","headers":{"X-A":"v\r\nBcc: evil@example.com"}}`, "control characters"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { // not parallel: the check below runs after them
			_, err := b.c.Deliver(t.Context(), delivery(tt.key, tt.payload))
			require.Error(t, err)
			require.True(t, connectors.IsPermanent(err), "%v", err)
			require.Contains(t, err.Error(), tt.want)
		})
	}
	require.Empty(t, b.srv.Messages(), "refused before sending")
}

func TestMessageID(t *testing.T) {
	t.Parallel()
	require.Equal(t, wantMessageID("k", "outboxd"), email.MessageID("k", "outboxd"))
	require.Len(t, email.MessageID("anything", "outboxd"), len("<@outboxd>")+32)

	// A From whose domain is not a plain name falls back to "outboxd".
	srv := startServer(t, serverOptions{})
	c, err := email.New(email.Config{Addr: srv.addr, From: "relay@[127.0.0.1]"})
	require.NoError(t, err)
	raw, err := c.Deliver(t.Context(), delivery("k", `{"to":"a@example.com","text":"x"}`))
	require.NoError(t, err)
	require.Equal(t, wantMessageID("k", "outboxd"), decodeResult(t, raw).MessageID)
}

func TestNew(t *testing.T) {
	t.Parallel()
	const pass = "hunter2-very-secret"
	tests := []struct {
		name string
		cfg  email.Config
		want []string
	}{
		{"Empty", email.Config{}, []string{"Addr: required", "From: required"}},
		{"NoPort", email.Config{Addr: "smtp.example.com", From: testFrom}, []string{"Addr:", "host:port"}},
		{"BadPort", email.Config{Addr: "smtp.example.com:99999", From: testFrom}, []string{"Addr:", "port"}},
		{"NoHost", email.Config{Addr: ":25", From: testFrom}, []string{"Addr:", "no host"}},
		// No resolver looks these up: every attempt would fail, each row then dead.
		{"SpaceInHost", email.Config{Addr: " smtp.example.com:587", From: testFrom}, []string{"Addr:", `" smtp.example.com" is not a host name or IP address`}},
		{"SlashInHost", email.Config{Addr: "smtp.example.com/:587", From: testFrom}, []string{"Addr:", "not a host name or IP address"}},
		{"BadFrom", email.Config{Addr: "smtp.example.com:587", From: "nobody"}, []string{"From:", "not an email address"}},
		{"BadTLS", email.Config{Addr: "smtp.example.com:587", From: testFrom, TLS: "always"}, []string{"TLS:", `"always"`}},
		{"NegativeTimeout", email.Config{Addr: "smtp.example.com:587", From: testFrom, Timeout: -time.Second}, []string{"Timeout:"}},
		{"PasswordWithoutUser", email.Config{Addr: "smtp.example.com:587", From: testFrom, Password: pass}, []string{"Password:"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c, err := email.New(tt.cfg)
			require.Error(t, err)
			require.Nil(t, c)
			for _, w := range tt.want {
				require.Contains(t, err.Error(), w)
			}
			require.NotContains(t, err.Error(), pass)
			for _, line := range strings.Split(err.Error(), "\n") {
				require.True(t, strings.HasPrefix(line, "email config: "), "%q", line)
			}
		})
	}

	c, err := email.New(email.Config{Addr: "[::1]:2525", From: testFrom})
	require.NoError(t, err)
	require.Equal(t, "email smtp://[::1]:2525 from orders@shop.example", c.String())
}

func TestRedaction(t *testing.T) {
	t.Parallel()
	const pass = "hunter2-very-secret"
	cfg := email.Config{Addr: "smtp.example.com:587", Username: "relay", Password: pass, From: testFrom}
	c, err := email.New(cfg)
	require.NoError(t, err)

	var buf bytes.Buffer
	logger := slog.New(slog.NewJSONHandler(&buf, nil))
	logger.Info("configured", "config", cfg, "connector", c)
	out := buf.String()
	require.NotContains(t, out, pass)
	require.Contains(t, out, "REDACTED")
	require.Contains(t, out, "smtp.example.com:587")

	for _, s := range []string{
		fmt.Sprint(cfg), fmt.Sprintf("%+v", cfg), fmt.Sprintf("%#v", cfg),
		fmt.Sprint(c), fmt.Sprintf("%+v", c), fmt.Sprintf("%v", &cfg),
		fmt.Sprintf("%#v", c), // the connector holds the secret too
	} {
		require.NotContains(t, s, pass)
	}
}
