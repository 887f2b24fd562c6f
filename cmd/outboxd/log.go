package main

import (
	"io"
	"log/slog"

	"github.com/outboxd/outboxd/internal/config"
)

// newLogger returns the logger a command writes to w (stderr): text, or JSON when
// OUTBOX_LOG_FORMAT=json, at OUTBOX_LOG_LEVEL. Read cfg with [config.LoadLog], or take
// it from [config.Config].
func newLogger(w io.Writer, cfg config.Log) *slog.Logger {
	opts := &slog.HandlerOptions{Level: cfg.SlogLevel()}
	if cfg.JSON() {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}
