package outbox

import (
	"encoding/json"
	"errors"
	"testing"
)

// The email connectors refuse two headers that differ only in case (they name one mail
// header); enqueue must refuse them first, with one clear error, instead of accepting a
// row that can only go dead.
func TestPrepare_EmailHeadersDifferingOnlyInCase(t *testing.T) {
	t.Parallel()
	_, err := prepare(Message{Key: "k", Connector: "email", Payload: json.RawMessage(
		`{"to":"a@example.com","subject":"s","text":"t","headers":{"x-tenant":"acme","X-Tenant":"globex"}}`)})
	if !errors.Is(err, ErrInvalidMessage) {
		t.Fatalf("prepare = %v, want ErrInvalidMessage", err)
	}
	t.Log(err)
}

// The Slack connector refuses a thread_ts not written as Slack writes a message's ts (it
// registers that check only in programs that load it): the outbox package's own Slack
// check refuses it too, so a program that writes intents without loading the connector
// gets one clear error rather than a row that goes dead.
func TestCheckSlack_ThreadTSMustBeAMessageTS(t *testing.T) {
	t.Parallel()
	for _, ts := range []string{"1602251441.0017", "1.2", "abc", " 1602251441.001700"} {
		var v any
		if err := json.Unmarshal([]byte(`{"channel":"C01","text":"t","thread_ts":"`+ts+`"}`), &v); err != nil {
			t.Fatal(err)
		}
		if err := checkSlack(v); !errors.Is(err, ErrInvalidMessage) {
			t.Fatalf("checkSlack(thread_ts %q) = %v, want ErrInvalidMessage", ts, err)
		}
	}
	var v any
	_ = json.Unmarshal([]byte(`{"channel":"C01","text":"t","thread_ts":"1602251441.001700"}`), &v)
	if err := checkSlack(v); err != nil {
		t.Fatalf("checkSlack(a message ts) = %v", err)
	}
}
