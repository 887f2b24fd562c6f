package mcpserver

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"strconv"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/outboxd/outboxd/internal/intent"
)

// ServeStdio serves one MCP session on in and out (newline-delimited JSON-RPC, as
// `outboxd mcp` does on stdin and stdout), every tool call acting as tok. It returns
// nil when the client closes in, and ctx's error when ctx ends first. Nothing but
// protocol messages is written to out.
//
// A client that closes in right after its requests (`outboxd mcp < calls.jsonl`, a
// one-shot pipe, a client ending its session) still gets their answers: the end of in
// is passed on to the SDK only once every request read has been answered, or was
// cancelled by the client, or after [Config.CallTimeout] and a few seconds more. The
// SDK takes the end of its input for the end of the session, cancels the calls still
// running and writes no more answers (modelcontextprotocol/go-sdk#1061).
func ServeStdio(ctx context.Context, svc *intent.Service, tok *intent.Token, in io.Reader, out io.Writer, cfg *Config) error {
	if tok == nil {
		return errors.New("serve stdio: a token is required")
	}
	s := New(svc, func(context.Context, *mcp.CallToolRequest) (*intent.Token, error) { return tok, nil }, cfg)
	calls := &openCalls{open: map[string]struct{}{}}
	drain := cfg.withDefaults().CallTimeout + stdioDrainMargin
	// The SDK reads in a goroutine of its own, which it does not wait for: one that
	// waits for answers when the session ends for another reason stops waiting then.
	waitCtx, stopWaiting := context.WithCancel(ctx)
	defer stopWaiting()
	err := s.Run(ctx, &mcp.IOTransport{
		Reader: io.NopCloser(&drainingReader{ctx: waitCtx, r: in, calls: calls, wait: drain}),
		Writer: nopWriteCloser{&answerWriter{w: out, calls: calls}},
	})
	if ctx.Err() == nil && (errors.Is(err, io.EOF) || errors.Is(err, mcp.ErrConnectionClosed)) {
		// The client closed stdin: the normal end of a stdio session.
		return nil
	}
	return err
}

// nopWriteCloser leaves closing out to its owner.
type nopWriteCloser struct{ io.Writer }

func (nopWriteCloser) Close() error { return nil }

// stdioDrainMargin is how much longer than a tool call's time limit ServeStdio waits,
// after the end of its input, for the answers still to come: a call that timed out
// still has its answer to write.
const stdioDrainMargin = 5 * time.Second

// openCalls are the requests read from a stdio client and not yet answered, by their
// JSON-RPC id.
type openCalls struct {
	mu   sync.Mutex
	open map[string]struct{}
	idle chan struct{} // closed once open is empty, while a reader waits for it
}

// lines calls f with each complete line of p, after the partial line *rest, and keeps
// the new partial line in *rest (dropped past the SDK's longest line, which it refuses).
func lines(rest *[]byte, p []byte, f func(line []byte)) {
	for {
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			break
		}
		if len(*rest) > 0 {
			f(append(*rest, p[:i]...))
			*rest = (*rest)[:0]
		} else {
			f(p[:i])
		}
		p = p[i+1:]
	}
	if len(*rest)+len(p) <= mcp.DefaultMaxLineLength {
		*rest = append(*rest, p...)
	}
}

// rpcMessage is what openCalls reads of a JSON-RPC message.
type rpcMessage struct {
	ID     json.RawMessage `json:"id"`
	Method string          `json:"method"`
	Params struct {
		RequestID json.RawMessage `json:"requestId"`
	} `json:"params"`
}

// messages decodes line, one JSON-RPC message or a batch of them; a line that is
// neither (the SDK answers it, or ends the session) gives none.
func messages(line []byte) []rpcMessage {
	line = bytes.TrimSpace(line)
	if len(line) > 0 && line[0] == '[' {
		var batch []rpcMessage
		_ = json.Unmarshal(line, &batch)
		return batch
	}
	var m rpcMessage
	if json.Unmarshal(line, &m) != nil {
		return nil
	}
	return []rpcMessage{m}
}

// idKey names a JSON-RPC id as the SDK compares them: a string, or a number that it
// reads as an integer; "" for no id.
func idKey(raw json.RawMessage) string {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if dec.Decode(&v) != nil {
		return ""
	}
	switch v := v.(type) {
	case string:
		return "s" + v
	case json.Number:
		if n, err := v.Int64(); err == nil {
			return "n" + strconv.FormatInt(n, 10)
		}
		if f, err := v.Float64(); err == nil {
			return "n" + strconv.FormatInt(int64(f), 10)
		}
	}
	return ""
}

// read notes the requests of a line read from the client, and the requests it cancels
// (a cancelled request gets no answer).
func (c *openCalls) read(line []byte) {
	for _, m := range messages(line) {
		switch {
		case m.Method == "notifications/cancelled":
			c.done(idKey(m.Params.RequestID))
		case m.Method != "":
			if id := idKey(m.ID); id != "" {
				c.mu.Lock()
				c.open[id] = struct{}{}
				c.mu.Unlock()
			}
		}
	}
}

// wrote notes the answers in a line written to the client.
func (c *openCalls) wrote(line []byte) {
	for _, m := range messages(line) {
		if m.Method == "" {
			c.done(idKey(m.ID))
		}
	}
}

// abandon gives up on the answers still to come: out cannot take them.
func (c *openCalls) abandon() {
	c.mu.Lock()
	defer c.mu.Unlock()
	clear(c.open)
	if c.idle != nil {
		close(c.idle)
		c.idle = nil
	}
}

func (c *openCalls) done(id string) {
	if id == "" {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.open, id)
	if len(c.open) == 0 && c.idle != nil {
		close(c.idle)
		c.idle = nil
	}
}

// wait returns once every request read has been answered or cancelled, ctx ends, or d
// has passed.
func (c *openCalls) wait(ctx context.Context, d time.Duration) {
	c.mu.Lock()
	if len(c.open) == 0 {
		c.mu.Unlock()
		return
	}
	if c.idle == nil {
		c.idle = make(chan struct{})
	}
	idle := c.idle
	c.mu.Unlock()
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-idle:
	case <-ctx.Done():
	case <-timer.C:
	}
}

// drainingReader reads a stdio client's input, noting its requests, and holds back the
// end of the input until they are answered (see [ServeStdio]).
type drainingReader struct {
	ctx   context.Context
	r     io.Reader
	calls *openCalls
	wait  time.Duration
	rest  []byte
}

func (r *drainingReader) Read(p []byte) (int, error) {
	n, err := r.r.Read(p)
	lines(&r.rest, p[:n], r.calls.read)
	if errors.Is(err, io.EOF) {
		if n > 0 {
			return n, nil // the end again at the next Read
		}
		if len(r.rest) > 0 {
			// A last message without its newline, which the SDK takes as well.
			r.calls.read(r.rest)
			r.rest = r.rest[:0]
		}
		r.calls.wait(r.ctx, r.wait)
	}
	return n, err
}

// answerWriter writes to a stdio client, noting the answers once written.
type answerWriter struct {
	w     io.Writer
	calls *openCalls
	rest  []byte
}

func (w *answerWriter) Write(p []byte) (int, error) {
	n, err := w.w.Write(p)
	lines(&w.rest, p[:n], w.calls.wrote)
	if err != nil {
		w.calls.abandon() // the client stopped reading: no answer will reach it
	}
	return n, err
}
