package connectors

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"net/http/httptrace"
	"slices"
	"sync/atomic"
)

// TraceSend returns ctx with a trace of the sending of the request made with it, and
// sent, which says, once the transport has returned the request's error, whether the
// receiver may have read the request (false: nothing of it reached the receiver, so
// the attempt cannot have been acted on). The request may have been read once net/http
// reports it written (httptrace's WroteRequest), but for two cases where it was not:
//
//   - net/http reports an HTTP/1 request written once it is in the connection's write
//     buffer, before it flushes that; on a connection the receiver (or a load balancer)
//     resets just then, a keep-alive one it timed out, the flush fails and not a byte
//     leaves. Over a connection of a transport from [CloneDefaultTransport], which
//     counts the bytes written to its connections, a request during which none was
//     written was not sent. (HTTP/2 connections are shared by requests: their counts
//     tell nothing of one request.)
//   - Under TLS 1.3 the client's side of the handshake ends before the server has
//     checked the client's certificate, so net/http writes the request and reads the
//     server's refusal (no certificate, an untrusted one) where the answer should be:
//     the server never completed its handshake, so it never read the request.
func TraceSend(ctx context.Context) (context.Context, func(err error) bool) {
	var (
		wrote atomic.Bool
		// written counts the bytes written to the request's connection, when they are
		// counted (see connWrites); before is the count when the request got it.
		written atomic.Pointer[atomic.Int64]
		before  atomic.Int64
	)
	ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
		GotConn: func(info httptrace.GotConnInfo) {
			w := connWrites(info.Conn)
			if w != nil {
				before.Store(w.Load())
			}
			written.Store(w)
		},
		WroteRequest: func(info httptrace.WroteRequestInfo) {
			if info.Err == nil {
				wrote.Store(true)
			}
		},
	})
	return ctx, func(err error) bool {
		if !wrote.Load() || refusedHandshake(err) {
			return false
		}
		// The transport is done writing by the time it returns the request's error.
		w := written.Load()
		return w == nil || w.Load() != before.Load()
	}
}

// countingConn is a connection that counts the bytes written to it (see TraceSend).
type countingConn struct {
	net.Conn
	written atomic.Int64
}

func (c *countingConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	c.written.Add(int64(n))
	return n, err
}

// countWrites wraps dial so that its connections count the bytes written to them.
func countWrites(dial func(ctx context.Context, network, addr string) (net.Conn, error)) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &countingConn{Conn: conn}, nil
	}
}

// connWrites returns the count of the bytes written to conn, an HTTP/1 connection
// (plain or TLS) of a transport from [CloneDefaultTransport]; else nil.
func connWrites(conn net.Conn) *atomic.Int64 {
	if tc, ok := conn.(*tls.Conn); ok {
		if tc.ConnectionState().NegotiatedProtocol == "h2" {
			return nil
		}
		conn = tc.NetConn()
	}
	if cc, ok := conn.(*countingConn); ok {
		return &cc.written
	}
	return nil
}

// handshakeAlerts are the TLS alerts a server sends only while its side of the handshake
// is not complete: it refuses the client's certificate (or its lack of one, or its
// signature), or the handshake as a whole.
var handshakeAlerts = []tls.AlertError{
	40,  // handshake_failure
	42,  // bad_certificate
	43,  // unsupported_certificate
	44,  // certificate_revoked
	45,  // certificate_expired
	46,  // certificate_unknown
	48,  // unknown_ca
	51,  // decrypt_error
	116, // certificate_required
}

// refusedHandshake reports whether err is a receiver's TLS alert that refused the
// handshake. crypto/tls returns a received alert as a *net.OpError "remote error" of
// its own unexported type, which reads as the AlertError of the same number.
func refusedHandshake(err error) bool {
	oe, ok := errors.AsType[*net.OpError](err)
	if !ok || oe.Op != "remote error" || oe.Err == nil {
		return false
	}
	return slices.ContainsFunc(handshakeAlerts, func(a tls.AlertError) bool { return oe.Err.Error() == a.Error() })
}
