package main

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/outbox"
)

// jsonb takes arrays and objects nested deeper than Go's JSON decoder does (10,000
// levels), and plain SQL can write such a payload; the webhook refuses it (dead). Reading
// it into a json.RawMessage ran the decoder's check, so one such row made list (text
// too), a filtered replay and its own inspect fail ("exceeded max depth"): the operator
// could see neither it nor any row beside it. The text outputs read it as it is.
func TestTextOutputTakesPayloadNestedPastGoDecoder(t *testing.T) {
	t.Parallel()
	d := newOpsDB(t)
	d.insert(t, fixture{Key: "plain", Status: outbox.StatusDead})
	d.insert(t, fixture{Key: "deep", Status: outbox.StatusDead,
		Payload: strings.Repeat("[", 10001) + strings.Repeat("]", 10001)})

	code, out, errOut := d.cli(t, "", "list", "--status", "dead")
	require.Equal(t, exitOK, code, errOut)
	require.Regexp(t, `(?m)^deep\s`, out)
	require.Regexp(t, `(?m)^plain\s`, out)

	code, out, errOut = d.cli(t, "", "inspect", "deep")
	require.Equal(t, exitOK, code, errOut)
	require.Contains(t, out, "[[[[")

	code, out, errOut = d.cli(t, "", "replay", "--status", "dead", "--dry-run")
	require.Equal(t, exitOK, code, errOut)
	require.Contains(t, out, "would replay: 2\n")
}
