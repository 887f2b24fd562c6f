package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/internal/config"
)

func TestNewLogger(t *testing.T) {
	t.Parallel()

	t.Run("TextAtInfo", func(t *testing.T) {
		t.Parallel()
		var buf bytes.Buffer
		logger := newLogger(&buf, config.Log{Format: "text", Level: "info"})
		logger.Debug("hidden")
		logger.Info("shown", "relay_id", "r1")
		require.NotContains(t, buf.String(), "hidden")
		require.Contains(t, buf.String(), "level=INFO msg=shown relay_id=r1")
	})

	t.Run("JSONAtWarn", func(t *testing.T) {
		t.Parallel()
		var buf bytes.Buffer
		logger := newLogger(&buf, config.Log{Format: "json", Level: "warn"})
		logger.Info("hidden")
		logger.Warn("shown", "err", "boom")
		lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
		require.Len(t, lines, 1)
		var entry map[string]any
		require.NoError(t, json.Unmarshal([]byte(lines[0]), &entry))
		require.Equal(t, "WARN", entry["level"])
		require.Equal(t, "shown", entry["msg"])
		require.Equal(t, "boom", entry["err"])
	})
}
