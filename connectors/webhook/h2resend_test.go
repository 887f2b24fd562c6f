package webhook_test

import (
	"bufio"
	"crypto/tls"
	"encoding/binary"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/connectors"
	"github.com/outboxd/outboxd/connectors/webhook"
)

// HTTP/2 frame types and flags this test's receiver uses (RFC 9113 section 6).
const (
	h2Data         = 0x0
	h2Headers      = 0x1
	h2RSTStream    = 0x3
	h2Settings     = 0x4
	h2GoAway       = 0x7
	h2FlagEnd      = 0x1 // END_STREAM on DATA and HEADERS, ACK on SETTINGS
	h2RefusedCode  = 0x7 // REFUSED_STREAM
	h2NoErrorCode  = 0x0
	h2ClientMagic  = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
	h2FrameHdrSize = 9
)

// h2Liar is an HTTP/2 receiver on loopback (TLS, ALPN h2) that takes each request whole,
// counts it as acted on, and then says it never processed it: with RST_STREAM
// REFUSED_STREAM, or with a GOAWAY whose last stream is 0. Those are the answers on
// which net/http's HTTP/2 transport resends a request by itself when it can rewind the
// body, and a receiver can send them wrongly (a proxy that lost the stream, a server
// shutting down after its handler ran).
type h2Liar struct {
	goAway   bool
	requests atomic.Int64
}

func (l *h2Liar) start(t *testing.T) (url string, client *http.Client) {
	t.Helper()
	cert := httptest.NewUnstartedServer(nil) // for its certificate and a client that trusts it
	cert.StartTLS()
	t.Cleanup(cert.Close)
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{
		Certificates: cert.TLS.Certificates,
		NextProtos:   []string{"h2"},
	})
	require.NoError(t, err)
	serveConns(t, ln, l.serve)

	tr := webhook.DefaultTransport().Clone() // ForceAttemptHTTP2, as in production
	tr.TLSClientConfig = cert.Client().Transport.(*http.Transport).TLSClientConfig.Clone()
	t.Cleanup(tr.CloseIdleConnections)
	return "https://" + ln.Addr().String() + "/hook", &http.Client{Transport: tr}
}

func (l *h2Liar) serve(c net.Conn) {
	br := bufio.NewReader(c)
	magic := make([]byte, len(h2ClientMagic))
	if _, err := io.ReadFull(br, magic); err != nil || string(magic) != h2ClientMagic {
		return
	}
	writeFrame := func(typ, flags byte, stream uint32, payload []byte) error {
		hdr := make([]byte, h2FrameHdrSize, h2FrameHdrSize+len(payload))
		hdr[0], hdr[1], hdr[2] = byte(len(payload)>>16), byte(len(payload)>>8), byte(len(payload))
		hdr[3], hdr[4] = typ, flags
		binary.BigEndian.PutUint32(hdr[5:], stream)
		_, err := c.Write(append(hdr, payload...))
		return err
	}
	if writeFrame(h2Settings, 0, 0, nil) != nil {
		return
	}
	hdr := make([]byte, h2FrameHdrSize)
	for {
		if _, err := io.ReadFull(br, hdr); err != nil {
			return
		}
		length := int(hdr[0])<<16 | int(hdr[1])<<8 | int(hdr[2])
		typ, flags := hdr[3], hdr[4]
		stream := binary.BigEndian.Uint32(hdr[5:]) & 0x7fffffff
		if _, err := io.CopyN(io.Discard, br, int64(length)); err != nil {
			return
		}
		switch {
		case typ == h2Settings && flags&h2FlagEnd == 0:
			if writeFrame(h2Settings, h2FlagEnd, 0, nil) != nil {
				return
			}
		case (typ == h2Data || typ == h2Headers) && flags&h2FlagEnd != 0:
			// The request is whole: the receiver acts on it, then denies having seen it.
			l.requests.Add(1)
			var err error
			if l.goAway {
				payload := make([]byte, 8) // last stream 0: "none of your streams was processed"
				binary.BigEndian.PutUint32(payload[4:], h2NoErrorCode)
				err = writeFrame(h2GoAway, 0, 0, payload)
			} else {
				payload := make([]byte, 4)
				binary.BigEndian.PutUint32(payload, h2RefusedCode)
				err = writeFrame(h2RSTStream, 0, stream, payload)
			}
			if err != nil {
				return
			}
		}
	}
}

// Over HTTP/2 too, the transport never sends a row's request a second time by itself.
// net/http's HTTP/2 transport resends a request refused with REFUSED_STREAM, or caught by
// a GOAWAY that says it was not processed, whenever it can rewind the body; a receiver
// (or a proxy before it) that says so after acting would then act twice within one
// attempt, unseen by the relay, on an instance that does not dedupe. The connector
// leaves the request without GetBody, so the attempt ends instead, ambiguous, and the
// relay decides.
func TestDeliver_HTTP2RefusalAfterTheRequestIsNotResent(t *testing.T) {
	t.Parallel()
	for name, goAway := range map[string]bool{"RefusedStream": false, "GoAway": true} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			l := &h2Liar{goAway: goAway}
			url, client := l.start(t)
			c, err := webhook.New(webhook.Config{URL: url, Client: client, Timeout: 5 * time.Second})
			require.NoError(t, err)

			raw, err := c.Deliver(t.Context(), delivery("k"))
			require.Error(t, err)
			require.Nil(t, raw)
			require.True(t, connectors.IsAmbiguous(err), "the whole request was sent: %v", err)
			require.NotErrorIs(t, err, webhook.ErrTimeout, "the attempt ended at the refusal")
			require.Equal(t, int64(1), l.requests.Load(), "the transport did not resend on its own")
		})
	}
}
