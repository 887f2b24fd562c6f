package slack_test

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxd/outboxd/connectors/slack"
)

// Blocks of types slack-go knows, with fields it does not model (Block Kit grows faster
// than the library), reach Slack as the payload writes them: the connector decoded them
// into slack-go's types and encoded those, which dropped every field the types lack, and
// sent an accessory of a type slack-go's Accessory does not encode (datetimepicker) as null.
func TestDeliver_BlocksVerbatim(t *testing.T) {
	t.Parallel()
	b := setup(t, slack.Config{})
	blocks := `[
		{"type":"section","text":{"type":"mrkdwn","text":"*order 42* paid","x_future_text_field":"kept"},"x_future_block_field":true},
		{"type":"actions","elements":[{"type":"button","text":{"type":"plain_text","text":"Open"},"action_id":"open","x_future_element_field":{"n":1.50}}]},
		{"type":"section","text":{"type":"plain_text","text":"When?"},"accessory":{"type":"datetimepicker","action_id":"when","initial_date_time":1628633820}},
		{"type":"divider","x_future":[1,2,3]}
	]`
	d := delivery("k")
	d.Payload = json.RawMessage(`{"channel":"C0TEST","text":"order 42 paid","blocks":` + blocks + `}`)
	require.NoError(t, slack.ValidatePayload(d.Payload), "Enqueue's check takes it")
	_, err := b.c.Deliver(t.Context(), d)
	require.NoError(t, err)
	require.JSONEq(t, blocks, b.f.LastForm()["blocks"][0], "the blocks as the payload wrote them")
}
