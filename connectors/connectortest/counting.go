package connectortest

import (
	"errors"
	"io"
	"net/http"
	"sync/atomic"
)

// CountingTransport counts the answer bytes read through it, and fails a read past
// StopAt, so that a test's memory stays bounded when the connector under test does not
// bound what it reads of an answer.
type CountingTransport struct {
	Next   http.RoundTripper
	StopAt int64
	read   atomic.Int64
}

// ErrReadPastBound is the error of a read past StopAt.
var ErrReadPastBound = errors.New("test: the connector read past the test's bound")

// RoundTrip implements http.RoundTripper.
func (t *CountingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := t.Next.RoundTrip(req)
	if resp != nil {
		resp.Body = &countingBody{ReadCloser: resp.Body, t: t}
	}
	return resp, err
}

// Read returns how many answer bytes were read through t.
func (t *CountingTransport) Read() int64 { return t.read.Load() }

type countingBody struct {
	io.ReadCloser
	t *CountingTransport
}

func (b *countingBody) Read(p []byte) (int, error) {
	if b.t.read.Load() >= b.t.StopAt {
		return 0, ErrReadPastBound
	}
	n, err := b.ReadCloser.Read(p)
	b.t.read.Add(int64(n))
	return n, err
}
