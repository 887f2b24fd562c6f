package mcpserver

import (
	"context"
	"errors"
	"io"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/outboxd/outboxd/internal/intent"
)

// ServeStdio serves one MCP session on in and out (newline-delimited JSON-RPC, as
// `outboxd mcp` does on stdin and stdout), every tool call acting as tok. It returns
// nil when the client closes in, and ctx's error when ctx ends first. Nothing but
// protocol messages is written to out.
func ServeStdio(ctx context.Context, svc *intent.Service, tok *intent.Token, in io.Reader, out io.Writer, cfg *Config) error {
	if tok == nil {
		return errors.New("serve stdio: a token is required")
	}
	s := New(svc, func(context.Context, *mcp.CallToolRequest) (*intent.Token, error) { return tok, nil }, cfg)
	err := s.Run(ctx, &mcp.IOTransport{Reader: io.NopCloser(in), Writer: nopWriteCloser{out}})
	if ctx.Err() == nil && (errors.Is(err, io.EOF) || errors.Is(err, mcp.ErrConnectionClosed)) {
		// The client closed stdin: the normal end of a stdio session.
		return nil
	}
	return err
}

// nopWriteCloser leaves closing out to its owner.
type nopWriteCloser struct{ io.Writer }

func (nopWriteCloser) Close() error { return nil }
