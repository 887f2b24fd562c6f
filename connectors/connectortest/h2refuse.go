package connectortest

import (
	"bufio"
	"crypto/tls"
	"encoding/binary"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
)

// HTTP/2 frame types, flags and codes H2Refuser uses (RFC 9113 section 6).
const (
	h2Data         = 0x0
	h2Headers      = 0x1
	h2RSTStream    = 0x3
	h2Settings     = 0x4
	h2GoAway       = 0x7
	h2FlagEnd      = 0x1 // END_STREAM on DATA and HEADERS, ACK on SETTINGS
	h2NoErrorCode  = 0x0
	h2ClientMagic  = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
	h2FrameHdrSize = 9
)

// HTTP/2 error codes for H2Refuser.ResetCode.
const (
	H2ProtocolError = 0x1
	H2RefusedStream = 0x7
)

// H2Refuser is an HTTP/2 receiver on loopback (TLS, ALPN h2) that takes each request
// whole, counts it as acted on, and then says it never processed it: with RST_STREAM
// (REFUSED_STREAM, or ResetCode), or with a GOAWAY whose last stream is 0. Those are
// the answers on which net/http's HTTP/2 transport resends a request by itself when it
// can rewind the body (PROTOCOL_ERROR too: golang/go#47635), and a receiver can send
// them wrongly (a proxy that lost the stream, a server shutting down after its handler
// ran). A connector must not let it: a second effect within one attempt, unseen by the
// relay.
type H2Refuser struct {
	// GoAway answers with a GOAWAY instead of RST_STREAM.
	GoAway bool
	// ResetCode is RST_STREAM's error code; zero is REFUSED_STREAM.
	ResetCode uint32
	requests  atomic.Int64
}

// Start serves on loopback until t's cleanup, and returns the receiver's base URL
// (https://127.0.0.1:port) and a client over a clone of base that trusts it.
func (l *H2Refuser) Start(t *testing.T, base *http.Transport) (url string, client *http.Client) {
	t.Helper()
	cert := httptest.NewUnstartedServer(nil) // for its certificate and a client that trusts it
	cert.StartTLS()
	t.Cleanup(cert.Close)
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{
		Certificates: cert.TLS.Certificates,
		NextProtos:   []string{"h2"},
	})
	require.NoError(t, err)
	ServeConns(t, ln, l.serve)

	tr := base.Clone()
	tr.TLSClientConfig = cert.Client().Transport.(*http.Transport).TLSClientConfig.Clone()
	t.Cleanup(tr.CloseIdleConnections)
	return "https://" + ln.Addr().String(), &http.Client{Transport: tr}
}

// Requests returns how many requests it took whole.
func (l *H2Refuser) Requests() int64 { return l.requests.Load() }

func (l *H2Refuser) serve(c net.Conn) {
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
	code := l.ResetCode
	if code == 0 {
		code = H2RefusedStream
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
			if l.GoAway {
				payload := make([]byte, 8) // last stream 0: "none of your streams was processed"
				binary.BigEndian.PutUint32(payload[4:], h2NoErrorCode)
				err = writeFrame(h2GoAway, 0, 0, payload)
			} else {
				payload := make([]byte, 4)
				binary.BigEndian.PutUint32(payload, code)
				err = writeFrame(h2RSTStream, 0, stream, payload)
			}
			if err != nil {
				return
			}
		}
	}
}

// ServeConns accepts ln's connections and serves each with serve in a goroutine of its
// own, until t's cleanup, which closes ln and every connection (idle ones in a client's
// pool included) and waits for those goroutines.
func ServeConns(t *testing.T, ln net.Listener, serve func(c net.Conn)) {
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		conns []net.Conn
	)
	t.Cleanup(func() {
		_ = ln.Close()
		mu.Lock()
		for _, c := range conns {
			_ = c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Go(func() {
				defer c.Close()
				serve(c)
			})
		}
	})
}
