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
